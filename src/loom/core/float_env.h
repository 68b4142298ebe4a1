// Subnormal floats flushed to zero. A product or sum with a subnormal operand (|x| <
// 2^-126) takes a microcode assist on x86 CPUs, up to ~100x the cycles; a loss spike fills
// activations and gradients with them and slows a step ~60x (issue 38), and saturated
// softmax rows make a few in healthy training too. With flushing on, the CPU treats
// subnormal inputs as zero (DAZ) and writes zero for subnormal results (FTZ); FZ on
// AArch64. Values at or above 2^-126 compute exactly as before.
//
// The setting belongs to a thread and a new thread inherits its creator's, so the process
// sets it on the main thread before any pool starts (apps/loom's main): every OpenMP
// worker, I/O and communication thread then has it. LOOM_FLUSH_DENORMALS=0 turns it off.
#pragma once

namespace loom {

// Sets flushing on the calling thread as LOOM_FLUSH_DENORMALS says (default 1); returns
// whether it is now on. A UserError names the variable when it is neither 0 nor 1.
bool flush_denormals_from_env();
// Sets it on the calling thread; false where the CPU or the build has no such mode.
bool set_flush_denormals(bool on);
// Whether the calling thread flushes (FTZ and DAZ both set; FZ on AArch64).
bool flushing_denormals();

}  // namespace loom

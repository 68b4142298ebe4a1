# Warnings everywhere in loom's own code; errors only where asked (LOOM_WERROR=ON:
# scripts/build.sh and the test command). A user's plain `cmake -DCMAKE_BUILD_TYPE=Release`
# must build with whatever warnings a newer or older GCC or clang adds.
option(LOOM_WERROR "Treat compiler warnings as errors (development and CI)" OFF)
add_compile_options(-Wall -Wextra -Wno-missing-field-initializers)
if(LOOM_WERROR)
  add_compile_options(-Werror)
  # GCC 12 at -O3 warns inside libstdc++ on `"literal" + std::string` (-Wrestrict, GCC bug
  # 105329, fixed in GCC 13): shown, not fatal.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    add_compile_options(-Wno-error=restrict)
  endif()
  # clang reports an `omp simd` loop it could not vectorize in one of the target_clones
  # versions (-Wpass-failed): a missed optimisation to look at, not an error.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options(-Wno-error=pass-failed)
  endif()
endif()
# Release (scripts/build.sh, and what users build): CMake's -O3. RelWithDebInfo: -O2 -g.
# The hot loops (reductions, copies) use target_clones for runtime dispatch, so the binary
# runs on any x86-64.
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -g -DNDEBUG")

# Sanitizer builds: -O1 and line tables only (what ASan's docs recommend; half the compile
# time of -O2 -g, and stack traces still name file and line).
if(NOT LOOM_SANITIZE STREQUAL "")
  set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -g1 -DNDEBUG")
  set(CMAKE_CXX_FLAGS_RELEASE "-O1 -g1 -DNDEBUG")
endif()

if(LOOM_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(LOOM_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT LOOM_SANITIZE STREQUAL "")
  message(FATAL_ERROR "LOOM_SANITIZE must be address, thread or empty, got '${LOOM_SANITIZE}'")
endif()

# Warnings are errors everywhere in loom's own code.
add_compile_options(-Wall -Wextra -Werror -Wno-missing-field-initializers)
# -O2 with debug info by default; the hot loops (reductions, copies) use
# target_clones for runtime dispatch, so the binary runs on any x86-64.
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -g -DNDEBUG")

# Sanitizer builds: -O1 and line tables only (what ASan's docs recommend; half the compile
# time of -O2 -g, and stack traces still name file and line).
if(NOT LOOM_SANITIZE STREQUAL "")
  set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -g1 -DNDEBUG")
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

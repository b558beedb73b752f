# kgx_translate.cmake: cmake -DIN=<kernels/cuda/x.cu> -DOUT=<x.cpp> -P this
# The host-execution build's one change to a CUDA source (see kgx.h): each
# launch `name<targs><<<cfg>>>(` becomes `name<targs> * kgx::cfg("name<targs>",
# cfg)(`; `extern __shared__ T name[];` a macro for the launch's dynamic
# shared memory; `__shared__ T name[N];` a function static that announces
# itself (kgx_shared_note) so the runtime can fill it with 0xff bytes before
# each block uses it. A source with a `<<<` or `__shared__` left over (a
# form these patterns do not recognise) is an error, not a kernel silently
# run wrong.
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z_0-9]*(<[A-Za-z_0-9:, <>()]*>)?)([ \n]*)<<<([^;\n]*)>>>\\("
       "\\1\\3 * kgx::cfg(\"\\1\", \\4)(" src "${src}")
string(REGEX REPLACE "extern __shared__ ([^;\n]*[^ ;\n]) +([A-Za-z_][A-Za-z_0-9]*)\\[\\];"
       "#define \\2 ((\\1 *)kgx_dyn_smem)" src "${src}")
string(REGEX REPLACE "__shared__ ([^;\n]*[^ ;\n]) +([A-Za-z_][A-Za-z_0-9]*)((\\[[A-Za-z_0-9 +*/()-]*\\])+);"
       "static \\1 \\2\\3; kgx_shared_note(\\2, sizeof \\2);" src "${src}")
foreach(left "<<<" "__shared__")
  string(FIND "${src}" "${left}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "kgx_translate: ${IN} has a ${left} kgx_translate.cmake does not recognise")
  endif()
endforeach()
file(WRITE "${OUT}.tmp" "// generated from ${IN} by kgx_translate.cmake: do not edit\n#line 1 \"${IN}\"\n${src}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")

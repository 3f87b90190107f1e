# sparsecomm_torch_pch(target TORCH_SOURCES a.cc ...): the listed sources of
# target include LibTorch; they get <torch/torch.h> precompiled, the target's
# other sources do not.
#
# Parsing LibTorch's headers is most of a torch file's compile time (torch.h
# alone: about 20 s at -O1 under ASan, 12 s in Release, on one core of the
# CI machine). The train layer precompiles them once per build; every other
# target reuses its header, so the flags that GCC checks (-O, -f..., -m...,
# macros) must stay the same across these targets, and -Winvalid-pch (with
# -Werror) says so when they drift.
function(sparsecomm_torch_pch target)
  cmake_parse_arguments(ARG "" "" "TORCH_SOURCES" ${ARGN})
  if(target STREQUAL "sparsecomm_train")
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM sparsecomm_train)
    # The header was made for a static library (-fPIC); GCC refuses it for
    # -fPIE code, so an executable is compiled as -fPIC (the last of the two
    # flags wins; on the whole target, since a unity build compiles its
    # sources as one). It costs nothing measurable.
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
  endif()
  get_target_property(others ${target} SOURCES)
  list(REMOVE_ITEM others ${ARG_TORCH_SOURCES})
  if(others)
    set_source_files_properties(${others} TARGET_DIRECTORY ${target}
                                PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

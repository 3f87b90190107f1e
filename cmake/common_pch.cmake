# Precompiled third-party headers for the torch-free targets.
#
# fmt, nlohmann/json, GoogleTest and CLI11 are header-heavy: parsing them is
# most of the compile time of a short source file (CLI11 alone: about 6 s
# per file in Release on one core of the CI machine). Each group of targets
# below compiles its header set once per build and the rest of the group
# reuses it, so the flags GCC checks (-O, -f..., -m..., -fPIC against -fPIE,
# macros) must stay the same inside a group; -Winvalid-pch (which CMake
# adds) with -Werror says so when they drift. The torch files have their own
# header (cmake/torch_pch.cmake).
#
# A source that includes what it uses still compiles without these headers
# (the fuzz build turns precompiled headers off: scripts/fuzz.sh).

set(SPARSECOMM_COMMON_PCH_HEADERS
    <algorithm> <cstdint> <functional> <map> <memory> <optional> <span> <stdexcept>
    <string> <string_view> <vector> <fmt/format.h> <nlohmann/json.hpp>)

# sparsecomm_library_pch(target [EXCEPT a.cc ...]): a torch-free library
# layer. sparsecomm_core compiles the header; the other layers reuse it.
# Sources with their own target flags (the AVX kernels) are listed in EXCEPT.
function(sparsecomm_library_pch target)
  cmake_parse_arguments(ARG "" "" "EXCEPT" ${ARGN})
  if(target STREQUAL "sparsecomm_core")
    target_precompile_headers(${target} PRIVATE ${SPARSECOMM_COMMON_PCH_HEADERS})
  else()
    target_precompile_headers(${target} REUSE_FROM sparsecomm_core)
  endif()
  if(ARG_EXCEPT)
    set_source_files_properties(${ARG_EXCEPT} TARGET_DIRECTORY ${target}
                                PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# sparsecomm_test_pch(target): a torch-free GoogleTest executable. The first
# one declared compiles the header (with gtest.h) and the later ones reuse it.
function(sparsecomm_test_pch target)
  get_property(owner GLOBAL PROPERTY SPARSECOMM_TEST_PCH_OWNER)
  if(NOT owner)
    target_precompile_headers(${target} PRIVATE ${SPARSECOMM_COMMON_PCH_HEADERS}
                              <gtest/gtest.h>)
    set_property(GLOBAL PROPERTY SPARSECOMM_TEST_PCH_OWNER ${target})
  else()
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()

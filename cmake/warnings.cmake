# sparsecomm_warnings(target): the project's warning flags, private to target.
function(sparsecomm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                         -Wno-sign-conversion -Wnon-virtual-dtor -Wold-style-cast)
  if(SPARSECOMM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

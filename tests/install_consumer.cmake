# ctest -P script: installs the built project into a scratch prefix, builds
# examples/${EXAMPLE} against it with find_package(sparsecomm) and runs it.
set(prefix ${BINARY_DIR}/${EXAMPLE}-test/prefix)
set(build ${BINARY_DIR}/${EXAMPLE}-test/build)
file(REMOVE_RECURSE ${BINARY_DIR}/${EXAMPLE}-test)
foreach(step
    "${CMAKE_COMMAND};--install;${BINARY_DIR};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SOURCE_DIR}/examples/${EXAMPLE};-B;${build};-G;Ninja;-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${build}"
    "${build}/${EXAMPLE}")
  execute_process(COMMAND ${step} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "step failed (${result}): ${step}")
  endif()
endforeach()

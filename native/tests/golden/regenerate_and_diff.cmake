# ctest script: runs the Python reference into the build directory and fails, printing the
# diff, unless its output equals the committed golden file byte for byte.
#   cmake -DPYTHON=python3 -DREFERENCE=model_reference.py -DGOLDEN=model_tiny.golden
#         -DOUT=<build>/model_tiny.golden -P regenerate_and_diff.cmake
execute_process(COMMAND ${PYTHON} ${REFERENCE} ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${REFERENCE} failed (${rc})")
endif()
execute_process(COMMAND diff -u ${GOLDEN} ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE diff)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${GOLDEN} is not what ${REFERENCE} writes now; regenerate it with "
                      "python3 ${REFERENCE} (and re-check ModelGolden):\n${diff}")
endif()

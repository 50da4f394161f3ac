# Writes OUT (a man page) from TOOL's --help and --version with help2man; run by the `man` target.
#   cmake -DHELP2MAN=... -DTOOL=... -DNAME=... -DDESCRIPTION=... -DOUT=... -P man.cmake
execute_process(
  COMMAND ${HELP2MAN} --no-info --no-discard-stderr --name=${DESCRIPTION} --output=${OUT} ${TOOL}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "help2man could not write ${OUT} from ${TOOL}: ${err}")
endif()

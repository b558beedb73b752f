# kiln_add_plugin(<name> SOURCES src... [LIBS lib...] [OUTPUT_DIRECTORY dir]
#                 [INCLUDE_SDK dir] [NO_INSTALL] [NO_ENTRY_CHECK])
#
# Builds libkiln-<name>.so the way every kiln plugin must be built: a MODULE
# library (dlopen only, never linked), hidden visibility with only the
# kiln_plugin_init_v* entry exported through a version script, -Wl,-z,defs so
# an undefined symbol fails at link time instead of at load, and full RELRO.
# The target is named kiln-<name>. In kiln's own tree the library lands in the
# build's plugin directory and is installed with the host; out of tree it is
# installed to KILN_PLUGIN_DIR unless NO_INSTALL is given.
# INCLUDE_SDK builds against another copy of the headers (kiln's own tests use
# it to build a plugin against the frozen ABI 1.0 headers).
# The link fails when the library does not define kiln_plugin_init_v1
# (--require-defined): a plugin without KILN_DEFINE_LIBRARY, or with a
# misspelt entry, is caught at build time instead of at `kiln plugins check`.
# NO_ENTRY_CHECK turns that off (kiln's tests build such broken libraries on
# purpose).
set(_KILN_HELPERS_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(kiln_add_plugin name)
  cmake_parse_arguments(KP "NO_INSTALL;NO_ENTRY_CHECK" "OUTPUT_DIRECTORY;INCLUDE_SDK" "SOURCES;LIBS" ${ARGN})
  if(NOT KP_SOURCES)
    message(FATAL_ERROR "kiln_add_plugin(${name}): SOURCES is required")
  endif()
  set(tgt kiln-${name})
  add_library(${tgt} MODULE ${KP_SOURCES})
  set_target_properties(${tgt} PROPERTIES
    PREFIX "lib" OUTPUT_NAME "kiln-${name}" SUFFIX ".so"
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON POSITION_INDEPENDENT_CODE ON
    LINK_DEPENDS "${_KILN_HELPERS_DIR}/kiln-plugin.map")
  if(KP_INCLUDE_SDK)
    target_include_directories(${tgt} BEFORE PRIVATE ${KP_INCLUDE_SDK})
  else()
    target_link_libraries(${tgt} PRIVATE Kiln::sdk)
  endif()
  if(KP_LIBS)
    target_link_libraries(${tgt} PRIVATE ${KP_LIBS})
  endif()
  target_link_options(${tgt} PRIVATE
    "LINKER:--version-script=${_KILN_HELPERS_DIR}/kiln-plugin.map"
    "LINKER:-z,defs" "LINKER:-z,now" "LINKER:-z,relro" "LINKER:--exclude-libs,ALL")
  if(NOT KP_NO_ENTRY_CHECK)
    target_link_options(${tgt} PRIVATE "LINKER:--require-defined=kiln_plugin_init_v1")
  endif()
  if(KP_OUTPUT_DIRECTORY)
    set_target_properties(${tgt} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${KP_OUTPUT_DIRECTORY}")
  elseif(DEFINED KILN_PLUGIN_BUILD_DIR)
    set_target_properties(${tgt} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${KILN_PLUGIN_BUILD_DIR}")
  endif()
  if(NOT KP_NO_INSTALL)
    if(DEFINED KILN_PLUGIN_INSTALL_DIR)
      install(TARGETS ${tgt} LIBRARY DESTINATION ${KILN_PLUGIN_INSTALL_DIR})
    elseif(DEFINED KILN_PLUGIN_DIR)
      install(TARGETS ${tgt} LIBRARY DESTINATION ${KILN_PLUGIN_DIR})
    endif()
  endif()
endfunction()

# ---------------------------------------------------------------------------
# What an out-of-tree plugin's project repeats around kiln_add_plugin(): the
# project defaults, a CUnit test of the plugin under the installed test host
# (Kiln::testing), and a test that runs the installation's `kiln`. kiln's
# own examples (examples/plugins/*) use them; docs/plugin-guide.md shows how.

# kiln_plugin_defaults(<PREFIX> <warnings-var>)
#
# A macro (it sets the caller's variables): RelWithDebInfo when no build type
# is chosen, C11 without GNU extensions, and in <warnings-var> the warnings
# kiln's plugins build with (-Wall -Wextra -Wshadow -Wstrict-prototypes),
# with -Werror when the option <PREFIX>_WERROR (declared here, OFF) is ON.
macro(kiln_plugin_defaults _kpd_prefix _kpd_warnings)
  option(${_kpd_prefix}_WERROR "treat warnings as errors" OFF)
  if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
    set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "build type" FORCE)
  endif()
  set(CMAKE_C_STANDARD 11)
  set(CMAKE_C_STANDARD_REQUIRED ON)
  set(CMAKE_C_EXTENSIONS OFF)
  set(${_kpd_warnings} -Wall -Wextra -Wshadow -Wstrict-prototypes)
  if(${_kpd_prefix}_WERROR)
    list(APPEND ${_kpd_warnings} -Werror)
  endif()
endmacro()

# kiln_add_plugin_test(<test> PLUGIN <name> SOURCES src... [PATH_DEFINE <macro>]
#                      [INCLUDES dir...] [LIBS lib...] [COMPILE_OPTIONS opt...])
#
# A CUnit test executable <test> for the plugin built by
# kiln_add_plugin(<name>), registered with CTest: linked with Kiln::testing,
# CUnit (pkg-config cunit) and libm, built after the plugin, and given the
# plugin's path as the string macro PATH_DEFINE (default <NAME>_PLUGIN_PATH,
# the name upper-cased, '-' as '_'). Without CUnit the test is left out with
# a STATUS line. The test's main() can be kiln_testing_run_cunit()
# (kiln/testing_cunit.h).
function(kiln_add_plugin_test test)
  cmake_parse_arguments(KT "" "PLUGIN;PATH_DEFINE" "SOURCES;INCLUDES;LIBS;COMPILE_OPTIONS" ${ARGN})
  if(NOT KT_PLUGIN OR NOT KT_SOURCES)
    message(FATAL_ERROR "kiln_add_plugin_test(${test}): PLUGIN and SOURCES are required")
  endif()
  if(NOT TARGET PkgConfig::CUNIT)
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(CUNIT QUIET IMPORTED_TARGET GLOBAL cunit)
    endif()
  endif()
  if(NOT TARGET PkgConfig::CUNIT)
    message(STATUS "${KT_PLUGIN}: CUnit not found (pkg-config cunit); ${test} is not built")
    return()
  endif()
  if(NOT KT_PATH_DEFINE)
    string(TOUPPER "${KT_PLUGIN}_PLUGIN_PATH" KT_PATH_DEFINE)
    string(REPLACE "-" "_" KT_PATH_DEFINE "${KT_PATH_DEFINE}")
  endif()
  add_executable(${test} ${KT_SOURCES})
  if(KT_INCLUDES)
    target_include_directories(${test} PRIVATE ${KT_INCLUDES})
  endif()
  target_link_libraries(${test} PRIVATE Kiln::testing PkgConfig::CUNIT m ${KT_LIBS})
  if(KT_COMPILE_OPTIONS)
    target_compile_options(${test} PRIVATE ${KT_COMPILE_OPTIONS})
  endif()
  target_compile_definitions(${test} PRIVATE ${KT_PATH_DEFINE}="$<TARGET_FILE:kiln-${KT_PLUGIN}>")
  add_dependencies(${test} kiln-${KT_PLUGIN})
  add_test(NAME ${test} COMMAND ${test})
endfunction()

# kiln_find_executable(<var>)
#
# The `kiln` of the installation this SDK came from (<prefix>/bin/kiln, found
# from KILN_PLUGIN_DIR), into the cache variable <var>; <var>-NOTFOUND when
# the SDK was installed without it.
function(kiln_find_executable var)
  get_filename_component(_kfe_prefix "${KILN_PLUGIN_DIR}/../../.." ABSOLUTE)
  find_program(${var} kiln HINTS "${_kfe_prefix}/bin" NO_DEFAULT_PATH)
endfunction()

# kiln_add_run_test(<test> SCRIPT <script> [ARGS arg...] [TIMEOUT seconds])
#
# A CTest test running `bash <script> <kiln> <build dir> <args>...` with the
# installation's kiln (kiln_find_executable): a script that trains the
# plugin for real. Exit status 77 means skipped (no data, say); TIMEOUT
# defaults to 600 s. Without an installed kiln the test is left out with a
# STATUS line.
function(kiln_add_run_test test)
  cmake_parse_arguments(KR "" "SCRIPT;TIMEOUT" "ARGS" ${ARGN})
  if(NOT KR_SCRIPT)
    message(FATAL_ERROR "kiln_add_run_test(${test}): SCRIPT is required")
  endif()
  if(NOT KR_TIMEOUT)
    set(KR_TIMEOUT 600)
  endif()
  kiln_find_executable(KILN_EXECUTABLE)
  if(NOT KILN_EXECUTABLE)
    message(STATUS "${test}: no kiln executable beside the SDK (${KILN_PLUGIN_DIR}/../../../bin); not run")
    return()
  endif()
  add_test(NAME ${test} COMMAND bash ${KR_SCRIPT} ${KILN_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR} ${KR_ARGS})
  set_tests_properties(${test} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${KR_TIMEOUT})
endfunction()

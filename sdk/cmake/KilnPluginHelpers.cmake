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

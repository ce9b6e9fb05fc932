# rebound_module(NAME SOURCES file... [DEPENDS module...])
#
# One folder of src/ (or tools/) = one OBJECT library, rb_<NAME>. Its own
# folder is on its include path, and so are the folders of the modules it
# DEPENDS on (their usage requirements propagate, transitively), never the
# folders of modules above it: an #include against the direction of the
# dependencies fails to compile. The module map and the direction are in
# docs/ARCHITECTURE.md; tests/check_layout.sh checks the same rules from the
# sources (no ../ includes, no cycles).
function(rebound_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPENDS" ${ARGN})
  add_library(rb_${name} OBJECT ${M_SOURCES})
  target_include_directories(rb_${name} PUBLIC
    ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  foreach(dep ${M_DEPENDS})
    target_link_libraries(rb_${name} PUBLIC rb_${dep})
  endforeach()
  target_link_libraries(rb_${name} PUBLIC Threads::Threads)
  set_target_properties(rb_${name} PROPERTIES
    POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden)
endfunction()

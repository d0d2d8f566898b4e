# KilnInstall.cmake - `make install` (included at the end of CMakeLists.txt).
#
# Installs the kiln tool, libkiln (with a SONAME: libkiln.so.<major> while
# the version is 0.x that is libkiln.so.0; the version comes from
# KILN_VERSION_STRING in include/kiln/kiln.h), the public header, kiln.pc
# for pkg-config and a CMake package (find_package(Kiln) -> Kiln::kiln).
# The installed tool finds libkiln through an rpath of $ORIGIN/../lib, so a
# DESTDIR or relocated install works. tests/release/test_install.sh checks
# it end to end.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

file(STRINGS ${PROJECT_SOURCE_DIR}/include/kiln/kiln.h KILN_VERSION_LINE
     REGEX "^#define KILN_VERSION_STRING \"[0-9]+\\.[0-9]+\\.[0-9]+\"")
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" KILN_VERSION "${KILN_VERSION_LINE}")
string(REGEX MATCH "^[0-9]+" KILN_SOVERSION "${KILN_VERSION}")

set_target_properties(kiln PROPERTIES VERSION ${KILN_VERSION} SOVERSION ${KILN_SOVERSION})
set_property(TARGET kiln PROPERTY INTERFACE_INCLUDE_DIRECTORIES
             $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(kiln_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS kiln EXPORT KilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Development)
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/kiln/kiln.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln COMPONENT Development)

configure_file(${PROJECT_SOURCE_DIR}/cmake/kiln.pc.in ${PROJECT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kiln.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)

install(EXPORT KilnTargets NAMESPACE Kiln::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln COMPONENT Development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/KilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/KilnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
  VERSION ${KILN_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KilnConfig.cmake ${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln COMPONENT Development)

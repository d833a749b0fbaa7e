# Targets of the device queues and experiment A (issue 17), shared by the top-level CMakeLists.txt
# (its "device queues" block) and the standalone tools/gpu/CMakeLists.txt the GPU machine builds:
#   test_queues_host  the rings on std::threads, compiled by the host compiler (label unit)
#   test_queues_host_tsan  the same under ThreadSanitizer, where the toolchain has it
#   test_gpu_queues   the rings on the GPU and across the bus (label gpu; skips without a device)
#   exp_stages        experiment A (tools/gpu/exp_stages.cu; docs/perf/gpu-scheduling.md)
# Needs: CUDA enabled, CUDAToolkit found; GTest for the two tests (skipped without it).
set(SSQ_ROOT ${CMAKE_CURRENT_LIST_DIR}/../..)
# libcu++ (cuda/atomic) lives in include/cccl since CUDA 13; the host compiler needs it named.
find_path(SSQ_CCCL_INCLUDE cuda/atomic HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES cccl NO_DEFAULT_PATH)
if(NOT SSQ_CCCL_INCLUDE)
  message(FATAL_ERROR "device queues: cuda/atomic (libcu++) not found under ${CUDAToolkit_INCLUDE_DIRS}")
endif()
if(NOT TARGET Threads::Threads)
  find_package(Threads REQUIRED)
endif()
set(SSQ_CUDA_WARN $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror>)

add_executable(exp_stages ${SSQ_ROOT}/tools/gpu/exp_stages.cu)
target_include_directories(exp_stages PRIVATE ${SSQ_ROOT}/src)
target_compile_options(exp_stages PRIVATE ${SSQ_CUDA_WARN})
target_link_libraries(exp_stages PRIVATE CUDA::cudart Threads::Threads)

if(NOT TARGET GTest::gtest)
  find_package(GTest QUIET)
endif()
if(TARGET GTest::gtest)
  include(GoogleTest)
  add_executable(test_queues_host ${SSQ_ROOT}/tests/gpu/queues/host_rings_test.cpp)
  target_include_directories(test_queues_host PRIVATE ${SSQ_ROOT}/src ${SSQ_CCCL_INCLUDE} ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(test_queues_host PRIVATE -Wall -Wextra -Werror)
  target_link_libraries(test_queues_host PRIVATE GTest::gtest GTest::gtest_main Threads::Threads)
  gtest_discover_tests(test_queues_host DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)

  # The same tests under ThreadSanitizer: x86 hardware never reorders a store past a store, so a
  # missing release would pass above; TSan models the C++ memory model and reports it as a race.
  # Built only where the toolchain links -fsanitize=thread and no other sanitizer is on.
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=thread)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=thread)
  check_cxx_source_compiles("int main() { return 0; }" SSQ_HAVE_TSAN)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(SSQ_HAVE_TSAN AND NOT SELFSERVE_SANITIZE)
    add_executable(test_queues_host_tsan ${SSQ_ROOT}/tests/gpu/queues/host_rings_test.cpp)
    target_include_directories(test_queues_host_tsan PRIVATE ${SSQ_ROOT}/src ${SSQ_CCCL_INCLUDE} ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_options(test_queues_host_tsan PRIVATE -Wall -Wextra -Werror -O1 -g -fsanitize=thread)
    target_link_options(test_queues_host_tsan PRIVATE -fsanitize=thread)
    target_link_libraries(test_queues_host_tsan PRIVATE GTest::gtest GTest::gtest_main Threads::Threads)
    gtest_discover_tests(test_queues_host_tsan DISCOVERY_TIMEOUT 60 TEST_SUFFIX .tsan PROPERTIES LABELS unit)
  endif()

  add_executable(test_gpu_queues ${SSQ_ROOT}/tests/gpu/queues/gpu_rings_test.cu)
  target_include_directories(test_gpu_queues PRIVATE ${SSQ_ROOT}/src)
  target_compile_options(test_gpu_queues PRIVATE ${SSQ_CUDA_WARN})
  target_link_libraries(test_gpu_queues PRIVATE CUDA::cudart GTest::gtest GTest::gtest_main Threads::Threads)
  gtest_discover_tests(test_gpu_queues DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "gpu")
else()
  message(STATUS "device queues: GTest not found, test_queues_host and test_gpu_queues not built")
endif()

# gradcomp_enable_cuda(<what> <result-var>): enables the CUDA language and
# finds cudart and cuBLAS for the CUDA check (tests/cuda) and the CUDA benches
# (bench/cuda). Sets <result-var> to TRUE when both are usable; otherwise
# prints why "<what> skipped" and sets it to FALSE. A macro: enable_language
# and the toolkit's variables must land in the calling directory's scope.
macro(gradcomp_enable_cuda what result_var)
  set(${result_var} FALSE)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "gradcomp: ${what} skipped: no CUDA compiler found "
                   "(install the CUDA toolkit, or pass -DCMAKE_CUDA_COMPILER=<path to nvcc>)")
  else()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas)
      message(STATUS "gradcomp: ${what} skipped: nvcc found but not cudart/cuBLAS (FindCUDAToolkit)")
    else()
      message(STATUS "gradcomp: ${what} with ${CMAKE_CUDA_COMPILER} (CUDA ${CUDAToolkit_VERSION}), "
                     "architectures ${CMAKE_CUDA_ARCHITECTURES}")
      set(${result_var} TRUE)
    endif()
  endif()
endmacro()

# CUDA detection and the one list of CUDA code images.
#
# TESSERA_CUDA=AUTO|ON|OFF   AUTO builds the CUDA backend when nvcc is found
#                            (default location /usr/local/cuda/bin).
# TESSERA_CUDA_ARCHS         the single source of CUDA targets. Entries:
#                              sm_XY[a|f]   native code (SASS) for that arch
#                              compute_XY   PTX for that virtual arch (JIT on
#                                           later GPUs by the driver)
#                            or the one word `native`: the images of the GPUs
#                            this machine has, from `nvidia-smi
#                            --query-gpu=compute_cap` (9.0 -> sm_90a, 10.0 ->
#                            sm_100a, 12.0 -> sm_120, X.Y -> sm_XY), resolved
#                            at every configure; scripts/demo.sh passes it.
#                            The default stays the full list, so CI
#                            compile-checks every image.
# The same list feeds nvcc's -gencode flags and the build manifest that the
# kernel registry consults at run time (kernels/arch).

# tessera_native_cuda_archs(out): the code images of this machine's GPUs, one
# per distinct compute capability, in the order nvidia-smi lists them. A
# missing nvidia-smi or a GPU-less answer is a configure error naming the
# fix. The `a` images carry the arch-specific instructions (wgmma, tcgen05)
# that the registry's SM 9.0 and 10.0 candidates need.
function(tessera_native_cuda_archs out)
  find_program(TESSERA_NVIDIA_SMI nvidia-smi)
  if(NOT TESSERA_NVIDIA_SMI)
    message(FATAL_ERROR "TESSERA_CUDA_ARCHS=native needs nvidia-smi on PATH to find this "
                        "machine's GPUs; name the images instead, e.g. -DTESSERA_CUDA_ARCHS=sm_90a")
  endif()
  execute_process(COMMAND "${TESSERA_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                  OUTPUT_VARIABLE caps ERROR_VARIABLE err RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "TESSERA_CUDA_ARCHS=native: `nvidia-smi --query-gpu=compute_cap` failed "
                        "(${rc}): ${err}; name the images instead, e.g. -DTESSERA_CUDA_ARCHS=sm_90a")
  endif()
  string(REPLACE "\n" ";" caps "${caps}")
  set(images "")
  foreach(cap IN LISTS caps)
    string(STRIP "${cap}" cap)
    if(cap STREQUAL "")
      continue()
    endif()
    if(NOT cap MATCHES "^([0-9]+)\\.([0-9]+)$")
      message(FATAL_ERROR "TESSERA_CUDA_ARCHS=native: nvidia-smi reported compute capability "
                          "'${cap}', expected MAJOR.MINOR")
    endif()
    set(num "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    if(num STREQUAL "90" OR num STREQUAL "100")
      set(image "sm_${num}a")
    else()
      set(image "sm_${num}")
    endif()
    list(APPEND images "${image}")
  endforeach()
  list(REMOVE_DUPLICATES images)
  if(NOT images)
    message(FATAL_ERROR "TESSERA_CUDA_ARCHS=native: nvidia-smi lists no GPU; name the images "
                        "instead, e.g. -DTESSERA_CUDA_ARCHS=sm_90a, or build with TESSERA_CUDA=OFF")
  endif()
  set(${out} "${images}" PARENT_SCOPE)
endfunction()

# `cmake -P` (tests/scripts/demo_plan_test.sh) only needs the function.
if(CMAKE_SCRIPT_MODE_FILE)
  return()
endif()

set(TESSERA_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE TESSERA_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TESSERA_CUDA_ARCHS "sm_80;sm_86;sm_89;sm_90a;sm_100a;sm_120;compute_120"
    CACHE STRING "CUDA code images: sm_XY[a|f] for SASS, compute_XY for PTX")

set(TESSERA_HAVE_CUDA OFF)
if(NOT TESSERA_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TESSERA_HAVE_CUDA ON)
  elseif(TESSERA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_CUDA=ON but no nvcc was found; install the CUDA toolkit "
                        "at /usr/local/cuda or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  endif()
endif()

set(TESSERA_CUDA_GENCODE_FLAGS "")
set(TESSERA_CUDA_MANIFEST_ENTRIES "")
if(TESSERA_HAVE_CUDA)
  # CMake 3.25 does not know how to ask nvcc 13 for C++20, so CUDA sources
  # are C++17 (the host side of the project stays C++20).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  if(TESSERA_CUDA_ARCHS STREQUAL "native")
    # A normal variable: it shadows the cache entry (which stays `native`,
    # so a later configure asks again) here and in every subdirectory.
    tessera_native_cuda_archs(TESSERA_CUDA_ARCHS)
    message(STATUS "Tessera CUDA images for this machine's GPUs: ${TESSERA_CUDA_ARCHS}")
  endif()
  foreach(image IN LISTS TESSERA_CUDA_ARCHS)
    if(image MATCHES "^sm_([0-9]+)([af]?)$")
      set(num "${CMAKE_MATCH_1}")
      set(suffix "${CMAKE_MATCH_2}")
      list(APPEND TESSERA_CUDA_GENCODE_FLAGS
           "-gencode=arch=compute_${num}${suffix},code=sm_${num}${suffix}")
      string(APPEND TESSERA_CUDA_MANIFEST_ENTRIES "  {${num}, \"${suffix}\", false},\n")
    elseif(image MATCHES "^compute_([0-9]+)([af]?)$")
      set(num "${CMAKE_MATCH_1}")
      set(suffix "${CMAKE_MATCH_2}")
      list(APPEND TESSERA_CUDA_GENCODE_FLAGS
           "-gencode=arch=compute_${num}${suffix},code=compute_${num}${suffix}")
      string(APPEND TESSERA_CUDA_MANIFEST_ENTRIES "  {${num}, \"${suffix}\", true},\n")
    else()
      message(FATAL_ERROR "TESSERA_CUDA_ARCHS entry '${image}' is not sm_XY[a|f] or compute_XY")
    endif()
  endforeach()
  message(STATUS "Tessera CUDA backend: ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}; images: ${TESSERA_CUDA_ARCHS})")
else()
  message(STATUS "Tessera CUDA backend: OFF")
endif()

# tessera_cuda_target(target): applies the -gencode list to a CUDA target.
function(tessera_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${TESSERA_CUDA_GENCODE_FLAGS} --expt-relaxed-constexpr -lineinfo>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()

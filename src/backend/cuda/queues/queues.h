// Device-resident queues (issue 17): bounded rings usable from host and device code.
//   SpscRing<T, N, Scope>  – one producer, one consumer (shared, global or mapped memory).
//   SeqRing<T, ...>        – many producers, many consumers; per-slot sequence numbers, so a slot that
//                            is reserved but not yet written is never read.
//   SubmissionRing<T>      – CPU → GPU through pinned mapped host memory: the CPU pushes with plain
//                            stores and a release, the GPU polls; no launch, no memcpy.
//   CompletionRing<T>      – GPU → CPU the same way.
// Ordering is explicit (cuda::atomic_ref, release/acquire at the narrowest scope that holds both
// ends), never the host ISA's: the same code is correct on x86 and on weakly ordered CPUs.
// docs/perf/gpu-scheduling.md has the design and the measurements.
// The rings need only libcu++ (include/cccl); the owners of mapped and device memory
// (mapped_memory.h) need the CUDA runtime: nvcc gets them always, a host-only compiler when
// SS_QUEUES_WITH_RUNTIME is defined (then link CUDA::cudart).
#pragma once
#include "backend/cuda/queues/platform.h"
#include "backend/cuda/queues/seq_ring.h"
#include "backend/cuda/queues/spsc_ring.h"
#if defined(SS_QUEUES_WITH_RUNTIME) || defined(__CUDACC__)
#include "backend/cuda/queues/mapped_memory.h"  // host-side owners; need the CUDA runtime
#endif

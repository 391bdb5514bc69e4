#pragma once
// A timeline of the decode chain, for measuring (not for production builds). In a build configured with
// -DSTRATA_PDL_TRACE=ON, thread 0 of block (0,0,0) of every kernel that calls pdl_wait() (cuda/pdl.cuh)
// records two %globaltimer readings: when it reached the wait and when the wait returned, with the source
// line of the call, into a per-translation-unit ring in device memory. In a chain of PDL launches a
// wait returns when the previous kernel has completed, so the time from one kernel's return to the
// next kernel's return is what that kernel adds to the chain, and "reached" tells whether its blocks
// were already there (launched early) or arrived late. The grid's last block (x) records its wait too,
// so a kernel whose blocks do not all start early shows it. pdl_mark() records, for the same two blocks,
// when they passed a point after the wait (e.g. a product's end), without an atomic on the chain (the
// wait reserves the records). pdl_end() (a block's end) adds, for every block, the time since its own
// wait returned to a per-site histogram, so a kernel's slowest blocks show too (not only those two).
// The models' destructors call dump_all() (reading the rings through their transfer module), which writes "file,line,reached_ns,returned_ns,kind" lines to
// $STRATA_PDL_TRACE_FILE; scripts/pdl-trace-report turns them into a per-kernel table. Without the
// build option (or without the variable) dump_all() does nothing.
// Measured overhead (H200, 48-layer 30B-A3B Q4_K decode): within the run-to-run noise of tok/s.
#include <cstddef>
#include <functional>

namespace strata::cuda::pdl_trace {

// read(dst, src, bytes): copies `bytes` of device memory at src to the host (the caller's cuda::Transfer).
using ReadDevice = std::function<void(void* dst, const void* src, size_t bytes)>;
void dump_all(const ReadDevice& read);

}  // namespace strata::cuda::pdl_trace

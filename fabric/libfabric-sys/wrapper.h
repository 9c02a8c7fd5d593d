/* Everything the fabric crate needs from libfabric. Most of the API (fi_domain,
 * fi_endpoint, fi_mr_reg, fi_write, fi_cq_read, ...) is static inline functions that
 * call through the ops tables of each fid; bindgen's wrap_static_fns turns each into
 * an exported `<name>__extern` function in a C file the build script compiles. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

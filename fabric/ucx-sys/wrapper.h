/* Everything the fabric crate needs from UCX: the UCP API pulls in ucs types. */
#include <ucp/api/ucp.h>

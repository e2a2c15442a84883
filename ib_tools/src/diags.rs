//! infiniband-diags (rdma-core): placeholder filled below.

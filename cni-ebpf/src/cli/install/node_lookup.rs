//! The pod CIDRs from the Node object: when `install` is given no `--pod-cidr` but a node
//! name (`--node-name`, or `NODE_NAME` from the downward API), it reads
//! `GET /api/v1/nodes/{name}` with the pod's ServiceAccount and uses `spec.podCIDRs`
//! (`spec.podCIDR` on older objects). A Node without one yet is an error: the
//! controller-manager assigns pod CIDRs shortly after a node registers, and the init
//! container failing (the kubelet retries it with back-off) is how the DaemonSet waits.

use super::*;
use crate::k8s::{self, ApiClient};

/// Reads `name`'s pod CIDRs from the API server (bounded by `--api-timeout`).
pub(super) fn pod_cidrs_from_node(args: &InstallArgs, name: &str) -> Result<Vec<IpNet>> {
    let rt = crate::kernel::link::runtime()?;
    let node = rt
        .block_on(async {
            let client = ApiClient::new(&args.api)?;
            client.node(name).await
        })
        .map_err(|source| InstallError::NodeLookup {
            node: name.to_owned(),
            source: Box::new(source),
        })?;
    let cidrs = k8s::pod_cidrs(&node).map_err(|reason| InstallError::NodeCidr {
        node: name.to_owned(),
        reason,
    })?;
    if cidrs.is_empty() {
        return Err(InstallError::NodeCidr {
            node: name.to_owned(),
            reason: "has no spec.podCIDRs yet: the controller-manager (--allocate-node-cidrs) \
                     has not assigned one, or the cluster does not allocate node CIDRs (then \
                     pass --pod-cidr); install fails so that the kubelet retries it"
                .into(),
        });
    }
    Ok(cidrs)
}

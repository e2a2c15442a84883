//! The path a perftest client connects over (perftest's address resolution): from the SA by LID or port GUID, or, for a peer given by GID, from the chosen source GID (`-g`), made locally on an Ethernet (RoCE) port.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use ib_core::sa_query::{self, PathRecord};

use super::Peer;
use super::run::{CONNECT_TIMEOUT, Env, e};

/// The SA's path from `port` to `peer` (a LID, or a port GUID under this
/// port's subnet prefix).
pub(crate) fn path_to(env: &mut Env<'_>, port: u8, peer: Peer) -> Result<PathRecord, String> {
    path_from(env, port, None, peer)
}

/// [`path_to`] from source GID index `gid_index` (RoCE's `-g`; default 0).
/// A peer given by GID is reached from that GID (on an Ethernet port the
/// path is made locally: no SA); an Ethernet port has no LIDs, so there
/// the peer must be a GID.
pub(crate) fn path_from(
    env: &mut Env<'_>,
    port: u8,
    gid_index: Option<u8>,
    peer: Peer,
) -> Result<PathRecord, String> {
    let eth = env
        .core
        .device(env.dev)
        .and_then(|d| d.port_link_layer(port).ok())
        == Some(ib_core::verbs::LinkLayer::Ethernet);
    match peer {
        Peer::Gid(g) => {
            let idx = usize::from(gid_index.unwrap_or(0));
            let sgid = env
                .core
                .device(env.dev)
                .ok_or(ib_core::Error::NoDev)
                .and_then(|d| d.get_cached_gid(port, idx))
                .map_err(|x| e("source GID", x))?;
            if sgid.0 == [0; 16] {
                return Err(format!("GID index {idx} of port {port} is empty (see show_gids)"));
            }
            sa_query::path_between(
                env.core,
                env.sa,
                env.dev,
                port,
                sgid,
                ib_core::verbs::Gid(g),
                CONNECT_TIMEOUT,
            )
        }
        _ if eth => {
            return Err(format!(
                "port {port} is an Ethernet (RoCE) port: give the peer by its GID (see show_gids there)"
            ));
        }
        Peer::Lid(l) => sa_query::path_to_lid(env.core, env.sa, env.dev, port, l, CONNECT_TIMEOUT),
        Peer::Guid(g) => {
            let src = crate::diags::Src { dev: env.dev, port };
            crate::diags::path_to_guid(env.core, env.sa, src, g, CONNECT_TIMEOUT)
        }
        // An IPv4 peer meets through perftest's TCP exchange (run/socket.rs),
        // which connects the QP from the peer's message: no path to ask for.
        Peer::Ip(ip) => return Err(format!("{ip} is an IP address: no path record to ask for")),
    }
    .map_err(|x| e("path record query", x))
}

/// A GID as `fe80::202:c9ff:fe00:1001` (the longest run of zero groups
/// folded, as inet_ntop does).
pub(crate) fn gid_text(g: &[u8; 16]) -> String {
    let w: Vec<u16> = g
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    let (mut best, mut best_len, mut i) = (8, 0, 0);
    while i < 8 {
        let start = i;
        while i < 8 && w[i] == 0 {
            i += 1;
        }
        if i - start > best_len {
            (best, best_len) = (start, i - start);
        }
        i += 1;
    }
    let hex = |ws: &[u16]| {
        ws.iter()
            .map(|x| format!("{x:x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    if best_len < 2 {
        return hex(&w);
    }
    format!("{}::{}", hex(&w[..best]), hex(&w[best + best_len..]))
}

//! Port of Linux `drivers/infiniband/core/agent.c` (3.11): the responder that sends the answers of the driver's SMA/PMA and the "unsupported" answers back on QP0/QP1.
//!
//! The address is built from the request's completion (`ib_init_ah_from_wc` of
//! verbs.c). Switch port-0 forwarding is left out. The forwarding of traps the
//! HCA's own SMA generates (mlx4_ib's `forward_trap`) lives here too, as the
//! SM agent's part ([`forward_trap`]).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::mad::{Grh, Mad, MadCtx, MadSendBuf, send_response};
use crate::verbs::{AhAttr, GlobalRoute, IB_QP_SET_QKEY, Wc, WcFlags};

/// `ib_init_ah_from_wc`: the address vector that answers the sender of a
/// received packet: its LID, SL and path bits, and with a GRH the reverse
/// route (hop limit 0xff) from the GID index of the GID the packet was sent
/// to; a GRH to a GID this port does not have is an error, as in Linux.
#[doc(alias = "ib_init_ah_from_wc")]
pub fn init_ah_from_wc(dev: &Device, port: u8, wc: &Wc, grh: Option<&Grh>) -> Result<AhAttr> {
    let grh = match (wc.wc_flags.contains(WcFlags::GRH), grh) {
        (true, Some(g)) => {
            let (p, i) = dev
                .find_cached_gid(&g.dgid())
                .ok_or(Error::Invalid("GRH to a GID this device does not have"))?;
            if p != port {
                return Err(Error::Invalid("GRH to a GID of another port"));
            }
            Some(GlobalRoute {
                dgid: g.sgid(),
                flow_label: g.flow_label(),
                sgid_index: u8::try_from(i).map_err(|_| Error::Invalid("GID index above 255"))?,
                hop_limit: 0xff,
                traffic_class: g.traffic_class(),
            })
        }
        (true, None) => return Err(Error::Invalid("completion flags a GRH but none was given")),
        (false, _) => None,
    };
    Ok(AhAttr {
        grh,
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        port_num: port,
    })
}

/// `agent_send_response`: sends `mad` back to where `wc` came from, on the
/// same special QP, with the request's P_Key index and the QP's own Q_Key.
/// A failure is logged and counted as a send error (the requester times out
/// and retries, as with a lost packet).
pub(crate) fn agent_send_response(
    cx: &mut MadCtx<'_>,
    mad: &Mad,
    grh: Option<&Grh>,
    wc: &Wc,
    qpi: usize,
) {
    let port = cx.mp.port();
    let ah_attr = match init_ah_from_wc(cx.dev, port, wc, grh) {
        Ok(a) => a,
        Err(e) => {
            cx.mp.counters.send_errors += 1;
            log::debug!("{}: port {port}: agent_send_response: {e}", cx.dev.name());
            return;
        }
    };
    let mut buf = MadSendBuf::new(mad.clone(), ah_attr, wc.src_qp);
    buf.remote_qkey = IB_QP_SET_QKEY;
    buf.pkey_index = wc.pkey_index;
    if let Err(e) = send_response(cx, qpi, buf) {
        cx.mp.counters.send_errors += 1;
        log::warn!("{}: port {port}: agent_send_response: {e}", cx.dev.name());
    }
}

/// mlx4_ib's `forward_trap`: a Trap the HCA's firmware SMA generated comes
/// to QP0 as a MAD received with SLID 0; it is sent on, as it is, to the
/// port's master SM (SM LID and SL from the port cache, QP0, P_Key index 0)
/// expecting no response. Nothing while the port knows no SM (Linux sends
/// nothing without its `sm_ah`). Counted as `traps_forwarded`.
pub(crate) fn forward_trap(cx: &mut MadCtx<'_>, mad: &Mad) {
    let port = cx.mp.port();
    let Ok(c) = cx.dev.port_cache(port) else {
        return;
    };
    let (sm_lid, sm_sl) = (c.sm_lid, c.sm_sl);
    if sm_lid == 0 {
        return;
    }
    let ah_attr = AhAttr {
        grh: None,
        dlid: sm_lid,
        sl: sm_sl,
        src_path_bits: 0,
        static_rate: 0,
        port_num: port,
    };
    let buf = MadSendBuf::new(mad.clone(), ah_attr, 0);
    match send_response(cx, 0, buf) {
        Ok(_) => cx.mp.counters.traps_forwarded += 1,
        Err(e) => {
            cx.mp.counters.send_errors += 1;
            log::warn!("{}: port {port}: forward_trap: {e}", cx.dev.name());
        }
    }
}

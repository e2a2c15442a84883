//! Port of Linux `drivers/infiniband/core/agent.c` (3.11): the responder that sends the answers of the driver's SMA/PMA (`process_mad` REPLY) and the "unsupported" answers back on QP0/QP1, with the address built from the request's completion (`ib_init_ah_from_wc` of verbs.c); switch port-0 forwarding is left out.

use hal::Clock;

use crate::device::{Device, MadConfig};
use crate::mad::{Grh, Mad, MadPort, MadSendBuf, send_response};
use crate::verbs::{AhAttr, GlobalRoute, IB_QP_SET_QKEY, Wc, WcFlags};

/// `ib_init_ah_from_wc`: the address vector that answers the sender of a
/// received packet: its LID, SL and path bits, and with a GRH the reverse
/// route (source GID index looked up in the cache; hop limit 0xff).
pub fn ib_init_ah_from_wc(dev: &Device, port: u8, wc: &Wc, grh: Option<&Grh>) -> AhAttr {
    let grh = if wc.wc_flags.contains(WcFlags::GRH) {
        grh.map(|g| {
            let sgid_index = dev
                .find_cached_gid(&g.dgid())
                .filter(|(p, _)| *p == port)
                .map_or(0, |(_, i)| i as u8);
            GlobalRoute {
                dgid: g.sgid(),
                flow_label: g.flow_label(),
                sgid_index,
                hop_limit: 0xff,
                traffic_class: g.traffic_class(),
            }
        })
    } else {
        None
    };
    AhAttr {
        grh,
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        port_num: port,
    }
}

/// `agent_send_response`: sends `mad` back to where `wc` came from, on the
/// same special QP, with the request's P_Key index and the QP's own Q_Key.
/// A failure is logged and counted as a send error (the requester times out
/// and retries, as with a lost packet).
#[allow(clippy::too_many_arguments)]
pub(crate) fn agent_send_response(
    dev: &mut Device,
    mp: &mut MadPort,
    clock: &dyn Clock,
    cfg: &MadConfig,
    mad: &Mad,
    grh: Option<&Grh>,
    wc: &Wc,
    qpi: usize,
) {
    let port = mp.port();
    let ah_attr = ib_init_ah_from_wc(dev, port, wc, grh);
    let mut buf = MadSendBuf::new(mad.clone(), ah_attr, wc.src_qp);
    buf.remote_qkey = IB_QP_SET_QKEY;
    buf.pkey_index = wc.pkey_index;
    if let Err(e) = send_response(dev, mp, clock, cfg, qpi, buf) {
        mp.counters.send_errors += 1;
        log::warn!("{}: port {port}: agent_send_response: {e}", dev.name());
    }
}

//! Our SA (`ib_sm`, in guest a) answering raw SA MADs from guest b, and our SM under bad input.
//!
//! The SA: every record type by Get and GetTable with component masks, RMPP
//! reassembled by guest b's ib_core, ServiceRecord set/get/delete,
//! MCMemberRecord join and leave of the IPoIB broadcast group and its
//! multicast PathRecord, MultiPathRecord, and the statuses OpenSM answers
//! for what it refuses (or its silence). The SM: a node that stops answering
//! in the middle of a sweep, a duplicate node GUID. Two driver-run guests on
//! the `--nodes 2` switch, no SM of the fabric's own.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::mad::{Mad, MadSendBuf, class, method};
use ib_core::verbs::{AhAttr, IB_QP1_QKEY, QpType, WcStatus};
use ib_core::{MadAgent, MadEvent};
use ib_sm::SmConfig;
use ib_sm::ib_types::{sa_attr, sa_method};
use sim::fabric::{Fabric, FaultKind, FaultRule, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(30);

struct Net {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    sm: ib_core::ClientId,
    /// Guest b's raw SA agent (RMPP receive on).
    agent: MadAgent,
    /// Fabric port of guest b's port 1.
    b_port: sim::fabric::PortId,
}

fn net_with(b_guid: Option<u64>, cfg: SmConfig) -> Net {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let b_port = built.hcas[1].ports[0];
    let fabric = Arc::new(Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut gs = built.hcas.iter().take(2).enumerate().map(|(i, h)| {
        let mut c = guest_config(h);
        if i == 1
            && let Some(g) = b_guid
        {
            c.node_guid = g;
            c.sys_image_guid = g + 3;
        }
        let hca = sim::SimHca::new_on_ports(c, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
        guest(hca, &h.name)
    });
    let mut a = gs.next().unwrap();
    let mut b = gs.next().unwrap();
    let sm = ib_sm::init(&mut a.core);
    ib_sm::start(&mut a.core, sm, a.dev, 1, cfg).unwrap();
    let agent = b
        .core
        .register_mad_agent(b.dev, 1, QpType::Gsi, None, 1)
        .unwrap();
    Net {
        fabric,
        a,
        b,
        sm,
        agent,
        b_port,
    }
}

fn sm_log(n: &mut Net) -> String {
    ib_sm::log(&mut n.a.core, n.sm, n.a.dev)
        .unwrap_or_default()
        .join("\n")
}

fn up(n: &mut Net) {
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    let log = sm_log(n);
    assert!(ok, "both ports Active; SM log:\n{log}");
}

/// An SA request: class 0x03 version 2.
fn sa_mad(meth: u8, attr: u16, comp_mask: u64, rec: &[u8]) -> Mad {
    let mut m = Mad::new_request(class::SUBN_ADM, 2, meth, attr, 0);
    m.0[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m.0[56..56 + rec.len()].copy_from_slice(rec);
    m
}

/// What came back: (status, attribute offset, records' bytes), or `None`
/// if nothing did (a dropped request).
type Answer = Option<(u16, u16, Vec<u8>)>;

/// Sends `m` from guest b to the SA (guest a's LID) and runs both guests
/// until the answer (or the request's timeout).
fn ask(n: &mut Net, m: Mad) -> Answer {
    let sm_lid = n.b.port(1).sm_lid;
    let mut buf = MadSendBuf::new(
        m,
        AhAttr {
            dlid: sm_lid,
            port_num: 1,
            ..AhAttr::default()
        },
        1,
    );
    buf.remote_qkey = IB_QP1_QKEY;
    buf.timeout_ms = 500;
    buf.retries = 1;
    let agent = n.agent;
    let id = n.b.core.post_send_mad(agent, buf).expect("posted");
    let mut got: Answer = None;
    let mut done = false;
    pump_until(&mut [&mut n.a, &mut n.b], Duration::from_secs(20), 1, |g| {
        while let Some(ev) = g[1].core.mad_poll_agent(agent) {
            match ev {
                MadEvent::Recv(r) if r.send_id == Some(id) => {
                    // RMPP data starts after the SA header; so does a
                    // single MAD's at 56.
                    let data = r
                        .rmpp_data
                        .clone()
                        .unwrap_or_else(|| r.mad.0[56..].to_vec());
                    let off = u16::from_be_bytes([r.mad.0[44], r.mad.0[45]]);
                    got = Some((r.mad.status(), off, data));
                }
                MadEvent::SendDone(s) if s.id == id => {
                    done = true;
                    if s.status != WcStatus::Success {
                        assert_eq!(s.status, WcStatus::RespTimeoutErr);
                    }
                }
                _ => {}
            }
        }
        done
    });
    got
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

/// The records of an answer, `off` 8-byte words each.
fn records(a: &(u16, u16, Vec<u8>)) -> Vec<Vec<u8>> {
    let step = usize::from(a.1) * 8;
    if step == 0 {
        return Vec::new();
    }
    a.2.chunks(step)
        .filter(|c| c.len() == step)
        .map(|c| c.to_vec())
        .collect()
}

#[test]
fn the_sa_answers_every_record_type_with_opensms_statuses() {
    let mut n = net_with(None, SmConfig::default());
    up(&mut n);
    let (la, lb) = (n.a.port(1).lid, n.b.port(1).lid);
    // Let a light sweep pass (the SA answers from the last heavy one).
    pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(1),
        1 << 20,
        |_| false,
    );

    // ClassPortInfo: OpenSM's answer.
    let cpi = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::CLASS_PORT_INFO, 0, &[]),
    )
    .unwrap();
    assert_eq!(cpi.0, 0);
    assert_eq!(be16(&cpi.2, 2), 0x2602, "capability mask");
    assert_eq!(&cpi.2[32..36], &[0, 0, 0, 1], "RedirectQP 1");
    assert_eq!(&cpi.2[68..72], &[0x80, 0x01, 0, 0], "TrapQKey");
    let st = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::CLASS_PORT_INFO, 0, &[]),
    );
    assert_eq!(st.unwrap().0, 0x0200, "ClassPortInfo GetTable: REQ_INVALID");

    // NodeRecord: every end port (a, b, the switch) in one RMPP transfer.
    let nr = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::NODE_RECORD, 0, &[]),
    )
    .unwrap();
    assert_eq!((nr.0, nr.1), (0, 14));
    let recs = records(&nr);
    assert_eq!(recs.len(), 3, "{recs:?}");
    // A Get with several matches, one with none, one by LID.
    let st = ask(&mut n, sa_mad(method::GET, sa_attr::NODE_RECORD, 0, &[]));
    assert_eq!(st.unwrap().0, 0x0400, "TOO_MANY_RECORDS");
    let st = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::NODE_RECORD, 1, &0x77u16.to_be_bytes()),
    );
    assert_eq!(st.unwrap().0, 0x0300, "NO_RECORDS");
    let one = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::NODE_RECORD, 1, &lb.to_be_bytes()),
    )
    .unwrap();
    assert_eq!((one.0, be16(&one.2, 0)), (0, lb));
    let st = ask(&mut n, sa_mad(method::SET, sa_attr::NODE_RECORD, 0, &[]));
    assert_eq!(st.unwrap().0, 0x000c, "Set NodeRecord: UNSUP_METHOD_ATTR");

    // PortInfoRecord of the SM ports only (what `saquery -s` asks:
    // CapabilityMask IsSM, bitwise with attribute modifier bit 31).
    let mut q = [0u8; 72];
    q[4 + 20..4 + 24].copy_from_slice(&2u32.to_be_bytes());
    let mut m = sa_mad(sa_method::GET_TABLE, sa_attr::PORTINFO_RECORD, 1 << 7, &q);
    m.set_attr_mod(1 << 31);
    let pir = ask(&mut n, m).unwrap();
    let recs = records(&pir);
    assert_eq!(recs.len(), 1, "only our port is an SM port: {recs:?}");
    assert_eq!(be16(&recs[0], 0), la);
    // Every PortInfoRecord: a, b, and the switch's 37 ports.
    let all = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::PORTINFO_RECORD, 0, &[]),
    )
    .unwrap();
    assert_eq!(records(&all).len(), 2 + 37);

    // LinkRecord, SMInfoRecord, SwitchInfoRecord, LFT record.
    let lr = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::LINK_RECORD, 0, &[]),
    )
    .unwrap();
    assert_eq!((lr.1, records(&lr).len()), (1, 4), "two cables, both ends");
    let smir = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::SMINFO_RECORD, 0, &[]),
    )
    .unwrap();
    let r = &records(&smir)[0];
    assert_eq!(be16(r, 0), la);
    assert_eq!(r[24] & 0xf, 3, "MASTER");
    assert_eq!(&r[12..20], &[0; 8], "no SM_Key shown");
    let sir = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::SWITCH_INFO_RECORD, 0, &[]),
    )
    .unwrap();
    assert_eq!(records(&sir).len(), 1);
    let lft = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::LFT_RECORD, 0, &[]),
    )
    .unwrap();
    let r = &records(&lft)[0];
    assert_eq!(
        (r[8 + usize::from(la)], r[8 + usize::from(lb)]),
        (1, 2),
        "LID -> port"
    );

    // PathRecord by LIDs, by GIDs; refusals.
    let gid = |lid: u16, n: &mut Net| {
        let g = if lid == la { &n.a } else { &n.b };
        g.core
            .device(g.dev)
            .unwrap()
            .port_cache(1)
            .unwrap()
            .get_gid(0)
            .unwrap()
            .0
    };
    let (ga, gb) = (gid(la, &mut n), gid(lb, &mut n));
    let mut pr = [0u8; 64];
    pr[40..42].copy_from_slice(&la.to_be_bytes());
    pr[42..44].copy_from_slice(&lb.to_be_bytes());
    let p = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::PATH_RECORD, 1 << 4 | 1 << 5, &pr),
    )
    .unwrap();
    assert_eq!(p.0, 0);
    assert_eq!(
        (be16(&p.2, 40), be16(&p.2, 42), p.2[54], p.2[55], p.2[56]),
        (la, lb, 0x85, 0x8c, 0x92)
    );
    let mut pr = [0u8; 64];
    pr[8..24].copy_from_slice(&ga);
    pr[24..40].copy_from_slice(&gb);
    let p = ask(
        &mut n,
        sa_mad(
            sa_method::GET_TABLE,
            sa_attr::PATH_RECORD,
            1 << 2 | 1 << 3,
            &pr,
        ),
    )
    .unwrap();
    let r = &records(&p)[0];
    assert_eq!(
        (be16(r, 40), be16(r, 42), r[49]),
        (la, lb, 0x80),
        "reversible"
    );
    pr[54] = 2 << 6 | 7;
    let st = ask(
        &mut n,
        sa_mad(
            method::GET,
            sa_attr::PATH_RECORD,
            1 << 2 | 1 << 3 | 1 << 16 | 1 << 17,
            &pr,
        ),
    );
    assert_eq!(st.unwrap().0, 0x0200, "an invalid MTU: REQ_INVALID");
    let st = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::PATH_RECORD, 1 << 2 | 1 << 3 | 1, &pr),
    );
    assert_eq!(st.unwrap().0, 0x0600, "half a ServiceID: INSUF_COMPS");
    pr[54] = 5; // selector 0: greater than 4096
    let st = ask(
        &mut n,
        sa_mad(
            method::GET,
            sa_attr::PATH_RECORD,
            1 << 2 | 1 << 3 | 1 << 16 | 1 << 17,
            &pr,
        ),
    );
    assert_eq!(st.unwrap().0, 0x0300, "MTU greater than 4096: no path");
    let mut bad = pr;
    bad[16..24].copy_from_slice(&0x1234u64.to_be_bytes());
    let st = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::PATH_RECORD, 1 << 2 | 1 << 3, &bad),
    );
    assert_eq!(
        st.unwrap().0,
        0x0300,
        "an unknown DGID: NO_RECORDS (OpenSM 3.3.23)"
    );

    // MultiPathRecord: GetMulti, one source and one destination GID.
    let mut mpr = [0u8; 200];
    mpr[15] = 1;
    mpr[16] = 1;
    mpr[24..40].copy_from_slice(&gb);
    mpr[40..56].copy_from_slice(&ga);
    let mut m = sa_mad(
        sa_method::GET_MULTI,
        sa_attr::MULTIPATH_RECORD,
        1 << 19 | 1 << 20,
        &mpr,
    );
    m.0[24] = 1;
    m.0[25] = 1;
    m.0[26] = 0x7;
    m.0[28..32].copy_from_slice(&1u32.to_be_bytes());
    m.0[32..36].copy_from_slice(&220u32.to_be_bytes());
    let mp = ask(&mut n, m).unwrap();
    assert_eq!(mp.0, 0);
    let r = &records(&mp)[0];
    assert_eq!((be16(r, 40), be16(r, 42)), (la, lb));

    // ServiceRecord: set, get by name, delete, delete again.
    let mut sr = [0u8; 176];
    sr[0..8].copy_from_slice(&0x1000_0000_0000_0001u64.to_be_bytes());
    sr[8..24].copy_from_slice(&gb);
    sr[48..55].copy_from_slice(b"legoib1");
    let st = ask(
        &mut n,
        sa_mad(method::SET, sa_attr::SERVICE_RECORD, 1 << 6, &sr),
    );
    assert_eq!(st.unwrap().0, 0x0200, "a Set without ServiceID and GID");
    let set = ask(
        &mut n,
        sa_mad(method::SET, sa_attr::SERVICE_RECORD, 0b11 | 1 << 6, &sr),
    )
    .unwrap();
    assert_eq!(set.0, 0);
    let mut q = [0u8; 176];
    q[48..55].copy_from_slice(b"legoib1");
    let got = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::SERVICE_RECORD, 1 << 6, &q),
    )
    .unwrap();
    assert_eq!((got.0, &got.2[8..24]), (0, &gb[..]));
    let del = ask(
        &mut n,
        sa_mad(sa_method::DELETE, sa_attr::SERVICE_RECORD, 0b11, &sr),
    )
    .unwrap();
    assert_eq!(del.0, 0);
    let st = ask(
        &mut n,
        sa_mad(sa_method::DELETE, sa_attr::SERVICE_RECORD, 0b11, &sr),
    );
    assert_eq!(st.unwrap().0, 0x0300, "gone");
    let st = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::SERVICE_RECORD, 1 << 6, &q),
    );
    assert_eq!(st.unwrap().0, 0x0300);

    // MCMemberRecord: the broadcast group exists; guest b joins and leaves.
    let bcast = ib_sm::sa::mcmember_record::IPV4_BCAST_MGID;
    let g = ask(
        &mut n,
        sa_mad(sa_method::GET_TABLE, sa_attr::MCMEMBER_RECORD, 0, &[]),
    )
    .unwrap();
    let r = &records(&g)[0];
    assert_eq!(&r[0..16], &bcast[..]);
    assert_eq!((be16(r, 36), &r[32..36]), (0xc000, &[0, 0, 0x0b, 0x1b][..]));
    let mut mc = [0u8; 56];
    mc[0..16].copy_from_slice(&bcast);
    mc[16..32].copy_from_slice(&gb);
    mc[48] = 1; // full member
    let join_mask = 1 | 1 << 1 | 1 << 16;
    let st = ask(
        &mut n,
        sa_mad(method::SET, sa_attr::MCMEMBER_RECORD, 1 | 1 << 1, &mc),
    );
    assert_eq!(st.unwrap().0, 0x0600, "a join without JoinState");
    let j = ask(
        &mut n,
        sa_mad(method::SET, sa_attr::MCMEMBER_RECORD, join_mask, &mc),
    )
    .unwrap();
    assert_eq!(j.0, 0);
    assert_eq!((be16(&j.2, 36), j.2[48] & 0xf), (0xc000, 1));
    // Its members' view, and the multicast PathRecord.
    let mut q = [0u8; 56];
    q[16..32].copy_from_slice(&gb);
    let mine = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::MCMEMBER_RECORD, 1 << 1, &q),
    )
    .unwrap();
    assert_eq!((mine.0, &mine.2[16..32]), (0, &gb[..]));
    let mut pr = [0u8; 64];
    pr[8..24].copy_from_slice(&bcast);
    let p = ask(
        &mut n,
        sa_mad(method::GET, sa_attr::PATH_RECORD, 1 << 2, &pr),
    )
    .unwrap();
    assert_eq!((p.0, be16(&p.2, 40), be16(&p.2, 42)), (0, 0xc000, lb));
    // A new group needs its Q_Key, P_Key, TClass, FlowLabel and SL.
    let mut newg = mc;
    newg[0..16].copy_from_slice(&[
        0xff, 0x12, 0x60, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    ]);
    let st = ask(
        &mut n,
        sa_mad(method::SET, sa_attr::MCMEMBER_RECORD, join_mask, &newg),
    );
    assert_eq!(st.unwrap().0, 0x0600, "create without its components");
    let l = ask(
        &mut n,
        sa_mad(sa_method::DELETE, sa_attr::MCMEMBER_RECORD, join_mask, &mc),
    )
    .unwrap();
    assert_eq!(l.0, 0);
    let st = ask(
        &mut n,
        sa_mad(sa_method::DELETE, sa_attr::MCMEMBER_RECORD, join_mask, &mc),
    );
    assert_eq!(st.unwrap().0, 0x0200, "a leave of a state not held");

    // What OpenSM drops: an attribute it does not serve, a foreign SM_Key.
    assert_eq!(ask(&mut n, sa_mad(method::GET, 0x0099, 0, &[])), None);
    let mut m = sa_mad(method::GET, sa_attr::NODE_RECORD, 1, &lb.to_be_bytes());
    m.0[36..44].copy_from_slice(&0x42u64.to_be_bytes());
    assert_eq!(ask(&mut n, m), None);
    // A class version the SA does not speak: ib_core answers for it.
    let mut m = sa_mad(method::GET, sa_attr::NODE_RECORD, 0, &[]);
    m.set_class_version(1);
    assert_eq!(ask(&mut n, m).unwrap().0, 0x000c);

    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{:?}", st.sa);
    assert!(
        st.sa.rmpp_transfers >= 2 && st.sa.rmpp_aborted == 0,
        "{:?}",
        st.sa
    );
    assert!(n.a.active() && n.b.active());
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

#[test]
fn a_node_that_stops_answering_mid_sweep_is_reported_and_taken_in_later() {
    let mut n = net_with(
        None,
        SmConfig {
            sweep_interval_ms: 1000,
            ..SmConfig::default()
        },
    );
    // Guest b answers discovery and takes its LID, then falls silent.
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 1, |g| {
        g[1].port(1).lid != 0
    });
    assert!(ok, "{}", sm_log(&mut n));
    n.fabric
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Drop).port(n.b_port));
    let (sm, dev) = (n.sm, n.a.dev);
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
        ib_sm::status(&mut g[0].core, sm, dev).is_some_and(|s| s.stats.init_errors >= 1)
    });
    let log = sm_log(&mut n);
    assert!(ok, "the sweep ends with errors:\n{log}");
    assert!(log.contains("Errors during initialization"), "{log}");
    assert!(log.contains("ERR 3119: Set method failed"), "{log}");
    assert!(!n.b.active(), "b was not brought up");
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert!(st.smps.timeouts >= 1 && st.smps.retried >= 3, "{st:?}");
    // b answers again: the next (heavy) sweep brings it up.
    n.fabric.lock().unwrap().faults.clear();
    up(&mut n);
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert!(st.stats.subnet_ups >= 1, "{st:?}");
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

#[test]
fn a_duplicate_node_guid_is_reported_and_the_rest_comes_up() {
    // Guest b claims guest a's node GUID (and so its port GUID).
    let a_guid = sim::fabric::topology::hca_guid(0);
    let mut n = net_with(
        Some(a_guid),
        SmConfig {
            sweep_interval_ms: 1000,
            ..SmConfig::default()
        },
    );
    let (sm, dev) = (n.sm, n.a.dev);
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
        g[0].active()
            && ib_sm::status(&mut g[0].core, sm, dev).is_some_and(|s| s.stats.duplicate_guids >= 1)
    });
    let log = sm_log(&mut n);
    assert!(ok, "{log}");
    assert!(
        log.contains("ERR 0D01: Found duplicated node GUID"),
        "{log}"
    );
    assert!(log.contains("Errors during initialization"), "{log}");
    assert!(!n.b.active(), "the duplicate is left alone");
    // Sweeps go on (no hang, no panic), each finding it again.
    pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(3),
        1 << 20,
        |_| false,
    );
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert!(st.stats.heavy_sweeps >= 2, "{st:?}");
    assert!(n.a.active());
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

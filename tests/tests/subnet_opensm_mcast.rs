//! Multicast groups under the real OpenSM: two driver-run HCAs join the IPv4 broadcast group it makes.
//!
//! Two model HCAs with the real stack (mlx4_core + mlx4_ib + ib_core) on the
//! `--nodes 2` topology under Debian's OpenSM (no partitions.conf: OpenSM makes
//! the IPv4 broadcast group ff12:401b:ffff::ffff:ffff, Q_Key 0x0B1B, itself).
//! Both guests join it through ib_core's multicast client with Linux IPoIB's
//! broadcast mask from before OpenSM's first sweep (the joins are tried again
//! while the SA does not answer), learn the Q_Key and MLID from the answer,
//! attach a UD QP to the group (MGID_HASH/READ_MCG/WRITE_MCG on the card), and
//! our `saquery -g` prints the group as Debian's `saquery -g` does; after an
//! OpenSM restart (a new SM that asks the clients to re-register) both join
//! again. Skipped loudly without the packages (`scripts/deps.sh
//! ensure_ib_peers`).

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::multicast::{self, McastEvent, McastId, MemberState};
use ib_core::sa_query::{self, McMemberRecord, join_state, mcmember_comp, sa_method};
use ib_core::verbs::{
    CqInitAttr, EventType, Gid, QpCap, QpCreateFlags, QpInitAttr, QpType, SigType,
};
use ib_core::{ClientId, IbCore};
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const JOIN_LIMIT: Duration = Duration::from_secs(60);
const DIAG_LIMIT: Duration = Duration::from_secs(20);

fn bcast_mgid() -> Gid {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff]);
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

/// Linux IPoIB's broadcast join (`ipoib_mcast_join`): MGID, PortGID,
/// P_Key, JoinState full member.
fn join(g: &mut Guest, mc: ClientId) -> McastId {
    let gid = g
        .core
        .device(g.dev)
        .unwrap()
        .port_cache(1)
        .unwrap()
        .get_gid(0)
        .unwrap();
    let rec = McMemberRecord {
        mgid: bcast_mgid(),
        port_gid: gid,
        pkey: 0xffff,
        join_state: join_state::FULL_MEMBER,
        ..McMemberRecord::default()
    };
    multicast::join(
        &mut g.core,
        mc,
        g.dev,
        1,
        &rec,
        mcmember_comp::IPOIB_BCAST_JOIN,
    )
    .expect("join started")
}

fn joined(core: &mut IbCore, mc: ClientId, id: McastId) -> Option<(McMemberRecord, u32)> {
    let s = multicast::status(core, mc, id).ok()?;
    (s.state == MemberState::Joined).then(|| (s.rec.unwrap(), s.generation))
}

/// A UD QP attached to the group's MGID and MLID (as IPoIB's
/// `ipoib_mcast_attach` after the join), with multicast loopback blocked.
fn attach(g: &mut Guest, mlid: u16) -> u32 {
    let d = g.core.device_mut(g.dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 8,
            comp_vector: 0,
        })
        .unwrap();
    let (qp, _) = d
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Ud,
                create_flags: QpCreateFlags::BLOCK_MULTICAST_LOOPBACK,
                port_num: 1,
            },
        )
        .unwrap();
    d.attach_mcast(qp, &bcast_mgid(), mlid).expect("attached");
    qp.qp_num
}

#[test]
fn two_driver_run_hcas_join_opensms_ipv4_broadcast_group() {
    if !peers_present("two_driver_run_hcas_join_opensms_ipv4_broadcast_group") {
        return;
    }
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, mut b) = sync_guests(&fabric, &built);
    let mc = [multicast::init(&mut a.core), multicast::init(&mut b.core)];
    // Joins asked before the SM has swept: the port is not Active, then
    // OpenSM ignores the SA until SUBNET UP; the joins are tried again.
    let ids = [join(&mut a, mc[0]), join(&mut b, mc[1])];
    let mut sm = OpenSm::start("mcast", &fabric, built.switches[0].1, true, &["-s", "1"]);
    let mut recs = [None, None];
    let ok = sm.pump_until(&mut [&mut a, &mut b], JOIN_LIMIT, 256, |_, g| {
        for k in 0..2 {
            recs[k] = joined(&mut g[k].core, mc[k], ids[k]);
        }
        recs.iter().all(Option::is_some)
    });
    assert!(
        ok,
        "both guests joined within {JOIN_LIMIT:?}: {:?} / {:?}; OpenSM log:\n{}",
        multicast::status(&mut a.core, mc[0], ids[0]),
        multicast::status(&mut b.core, mc[1], ids[1]),
        sm.log()
    );
    let recs = recs.map(|r| r.unwrap().0);
    for (k, g) in [&mut a, &mut b].into_iter().enumerate() {
        let r = recs[k];
        let name = &g.name;
        // What OpenSM gives the group it makes without partitions.conf:
        // the Q_Key is learned here, never assumed.
        assert_eq!(r.mgid, bcast_mgid(), "{name}");
        assert_eq!(r.qkey, 0x0b1b, "{name}: OpenSM's IPoIB Q_Key");
        assert!(
            (0xc000..0xffff).contains(&r.mlid),
            "{name}: MLID {:#x}",
            r.mlid
        );
        assert_eq!(
            (r.mtu, r.rate, r.sl, r.pkey),
            (4, 3, 0, 0xffff),
            "{name}: {r:?}"
        );
        assert_eq!(r.join_state & join_state::FULL_MEMBER, 1, "{name}");
        let c = multicast::counters(&mut g.core, mc[k], g.dev, 1).unwrap();
        eprintln!("{name}: joined {r:?}; {c:?}");
        assert!(c.joins_ok >= 1, "{name}: {c:?}");
        // The address vector the ULP sends with.
        let ah = multicast::init_ah_from_mcmember(g.core.device(g.dev).unwrap(), 1, &r).unwrap();
        assert_eq!(ah.dlid, r.mlid);
        assert_eq!(ah.grh.unwrap().dgid, bcast_mgid());
    }
    assert_eq!(recs[0].mlid, recs[1].mlid, "one group, one MLID");
    let mlid = recs[0].mlid;
    // Each guest's QP attached on its card.
    for g in [&mut a, &mut b] {
        let qpn = attach(g, mlid);
        assert_eq!(
            g.hca.mcg_members(&bcast_mgid().0),
            Some(vec![qpn | 1 << 30]),
            "{}: the MGM entry holds the QP, loopback blocked",
            g.name
        );
    }
    // Our saquery -g, asked from guest a (the query served by the test's
    // rounds, as OpenSM needs them).
    let q = sa_query::mcmember_rec_query(
        &mut a.core,
        a.sa,
        a.dev,
        1,
        sa_method::GET_TABLE,
        &McMemberRecord::default(),
        0,
        Duration::from_secs(8),
    )
    .unwrap();
    let mut resp = None;
    sm.pump_until(&mut [&mut a, &mut b], DIAG_LIMIT, 64, |_, g| {
        resp = sa_query::query_result(&mut g[0].core, g[0].sa, q);
        resp.is_some()
    });
    let groups = resp
        .expect("the SA answered our GetTable")
        .and_then(|r| r.mcmember_records())
        .expect("MCMemberRecords");
    let ours: String = groups
        .iter()
        .map(|r| {
            let mut s = String::new();
            ib_tools::diags::saquery::print_group_record(&mut s, r).unwrap();
            s
        })
        .collect();
    eprintln!("our saquery -g:\n{ours}");
    assert!(
        ours.contains("\t\tMGID....................ff12:401b:ffff::ffff:ffff\n"),
        "{ours}"
    );
    assert!(
        ours.contains(&format!("\t\tMlid....................0x{mlid:X}\n")),
        "{ours}"
    );
    // Debian's saquery -g from the SM host prints the same block.
    let mut g = [&mut a, &mut b];
    let (ok, theirs) = sm.diag(&mut g, "/usr/sbin/saquery", &["-g"], DIAG_LIMIT);
    assert!(ok, "saquery -g:\n{theirs}");
    eprintln!("Debian's saquery -g:\n{theirs}");
    let block = |s: &str| -> Option<String> {
        let i = s.find("ff12:401b:ffff::ffff:ffff")?;
        let start = s[..i].rfind("MCMemberRecord group dump:")?;
        let end = s[start..].find("\t\tSL").map(|e| start + e)?;
        let eol = s[end..].find('\n').map_or(s.len(), |e| end + e + 1);
        Some(s[start..eol].to_string())
    };
    assert_eq!(
        block(&ours),
        block(&theirs),
        "our group block and Debian's:\n{ours}\n---\n{theirs}"
    );
    // OpenSM counts both ports full members (saquery -m with OpenSM's
    // SM_Key, so that it names the port GIDs).
    let port_gids: Vec<String> = g
        .iter()
        .map(|x| {
            let gid = x
                .core
                .device(x.dev)
                .unwrap()
                .port_cache(1)
                .unwrap()
                .get_gid(0)
                .unwrap();
            format!("{}", ib_tools::cfmt::GidStr(gid))
        })
        .collect();
    let members = |sm: &mut OpenSm, g: &mut [&mut Guest]| -> String {
        let (ok, out) = sm.diag(g, "/usr/sbin/saquery", &["--smkey", "1", "-m"], DIAG_LIMIT);
        assert!(ok, "saquery -m:\n{out}");
        out
    };
    let out = members(&mut sm, &mut g);
    for gid in &port_gids {
        assert!(
            out.contains(&format!(
                "PortGid.................{gid}\n\t\tScopeState..............0x21"
            )),
            "{gid} a full member (scope 2, JoinState 1):\n{out}"
        );
    }
    let log = sm.log();
    assert!(
        !log.contains("ERR 1B"),
        "no SA MCMemberRecord error in OpenSM's log:\n{log}"
    );

    // A new OpenSM asks the clients to re-register: both join again.
    let gen0 = [
        multicast::status(&mut a.core, mc[0], ids[0])
            .unwrap()
            .generation,
        multicast::status(&mut b.core, mc[1], ids[1])
            .unwrap()
            .generation,
    ];
    let ev0 = [a.events().len(), b.events().len()];
    sm.restart(&mut [&mut a, &mut b], &["-s", "1"]);
    let mut again = [None, None];
    let ok = sm.pump_until(&mut [&mut a, &mut b], JOIN_LIMIT, 256, |sm, g| {
        for k in 0..2 {
            again[k] = joined(&mut g[k].core, mc[k], ids[k]).filter(|(_, gen_)| *gen_ > gen0[k]);
        }
        sm.subnet_ups() >= 1 && again.iter().all(Option::is_some)
    });
    assert!(
        ok,
        "both joined again after the restart: {again:?}; OpenSM log:\n{}",
        sm.current_log()
    );
    for (k, g) in [&mut a, &mut b].into_iter().enumerate() {
        let (r, _) = again[k].unwrap();
        assert_eq!((r.mgid, r.qkey), (bcast_mgid(), 0x0b1b), "{}", g.name);
        let ev = g.events()[ev0[k]..].to_vec();
        assert!(
            ev.contains(&(EventType::ClientReregister, 1)),
            "{}: the new SM asked for re-registration: {ev:?}",
            g.name
        );
        let mut seen = Vec::new();
        while let Some(e) = multicast::next_event(&mut g.core, mc[k], ids[k]) {
            seen.push(e);
        }
        assert!(seen.contains(&McastEvent::Reset), "{}: {seen:?}", g.name);
        assert!(
            matches!(seen.last(), Some(McastEvent::Joined(_))),
            "{}: {seen:?}",
            g.name
        );
    }
    // Leaving: OpenSM forgets a's membership, b stays.
    multicast::leave(&mut a.core, mc[0], ids[0]).unwrap();
    let mut g = [&mut a, &mut b];
    let ok = sm.pump_until(&mut g, DIAG_LIMIT, 64, |_, g| {
        let c = multicast::counters(&mut g[0].core, mc[0], g[0].dev, 1).unwrap();
        c.leaves_sent >= 1 && c.leave_errors == 0 && g[0].core.poll() == 0
    });
    assert!(ok, "the leave was answered");
    let out = members(&mut sm, &mut g);
    assert!(!out.contains(&port_gids[0]), "a left:\n{out}");
    assert!(out.contains(&port_gids[1]), "b stays:\n{out}");
    sm.stop();
    a.teardown();
    b.teardown();
}

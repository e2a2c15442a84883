//! Sweeps: discovery, LIDs, LFTs, Armed/Active, re-sweeps, restarts.

use sim::fabric::packet::{self, MAD_LEN, MadHdr, PERMISSIVE_LID, Smp, attr, method, mgmt_class};
use sim::fabric::sm::sm_state;

use crate::net::{Net, SM_GUID};

const SEC: u64 = 1_000_000_000;

fn up(n: usize) -> Net {
    let mut net = Net::star(n);
    assert!(
        net.run_until(5 * SEC, |n| n.sm_master()),
        "SUBNET UP: {:#?}",
        net.f.sm().map(|s| s.log())
    );
    net
}

#[test]
fn two_cas_come_up_active_with_distinct_lids_and_routes() {
    let mut net = up(2);
    let sm = net.f.sm().unwrap();
    let st = sm.stats().clone();
    println!(
        "embedded SM, 1 switch + 2 CAs: first heavy sweep {} SMPs in {} µs model time",
        st.smps_last_heavy,
        st.last_heavy_ns / 1000
    );
    for l in sm.log() {
        println!("  {l}");
    }
    let sm_lid = sm.lid();
    assert_ne!(sm_lid, 0);
    assert_eq!(sm.sm_state(), sm_state::MASTER);
    let (a, b) = (&net.cas[0], &net.cas[1]);
    assert_eq!((a.state, b.state), (4, 4), "both CA ports Active");
    assert!(a.lid != 0 && b.lid != 0 && a.lid != b.lid && a.lid != sm_lid && b.lid != sm_lid);
    assert_eq!((a.sm_lid, b.sm_lid), (sm_lid, sm_lid));
    assert_eq!(a.prefix, 0xfe80_0000_0000_0000);
    assert_eq!(a.subnet_timeout, 18);
    assert_eq!(
        a.nmtu, 4,
        "NeighborMTU: the smaller MTUCap of the link (2048)"
    );
    assert_eq!(sm.lid_of(a.port_guid()), Some(a.lid));
    let sw = net.f.switch(net.sw).unwrap();
    assert_ne!(sw.lid(), 0);
    assert!(![a.lid, b.lid, sm_lid].contains(&sw.lid()));
    // The LFT as the SM wrote it through SMPs.
    assert_eq!(sw.lft(a.lid), 1);
    assert_eq!(sw.lft(b.lid), 2);
    assert_eq!(sw.lft(sm_lid), 3);
    assert_eq!(sw.lft(sw.lid()), 0);
    assert!(sw.lft_top() >= a.lid.max(b.lid).max(sm_lid));
    for p in 1..=3 {
        assert_eq!(
            sw.port(p).unwrap().state,
            sim::fabric::LogicalState::Active,
            "switch port {p}"
        );
    }
    assert_eq!(sw.port(4).unwrap().state, sim::fabric::LogicalState::Down);
    // Every SMP crossed a cable: the capture holds them and their answers.
    let captured = net.f.capture_mut().unwrap().packets();
    assert!(
        captured >= 2 * st.smps_sent,
        "captured {captured} < 2 x {} SMPs",
        st.smps_sent
    );
    // LID routing works: a GMP from CA 0 reaches CA 1.
    let mut mad = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: 0x09,
        class_version: 1,
        method: method::GET,
        tid: 77,
        ..MadHdr::default()
    }
    .write(&mut mad);
    let dlid = net.cas[1].lid;
    assert!(net.send_gmp(0, dlid, &mad));
    net.run_for(10_000);
    let got = net.take_mads(1);
    assert_eq!(got.len(), 1, "CA 1 got the GMP by LID");
    assert_eq!(got[0].0.hdr.lrh.slid, net.cas[0].lid);
}

#[test]
fn a_ca_that_never_answers_is_reported_and_skipped() {
    let mut net = Net::star(3);
    net.cas[1].mute = true;
    assert!(
        net.run_until(10 * SEC, |n| n.sm_master()),
        "the sweep ended"
    );
    let sm = net.f.sm().unwrap();
    assert_eq!((net.cas[0].state, net.cas[2].state), (4, 4));
    assert_eq!(net.cas[1].state, 2, "the mute CA stays Init");
    assert_eq!(net.cas[1].smps, 4, "NodeInfo tried 1 + 3 times");
    assert!(
        sm.log()
            .iter()
            .any(|l| l.contains("no answer") && l.contains("[1, 2]")),
        "{:#?}",
        sm.log()
    );
    assert_eq!(sm.subnet().len(), 4, "SM, switch, 2 CAs");
    // Its switch port is left in Init (no one to talk to).
    let sw = net.f.switch(net.sw).unwrap();
    assert_eq!(sw.port(2).unwrap().state, sim::fabric::LogicalState::Init);
    // The SM tries again a second after a sweep with errors (not at the
    // 10 s light sweep): when the CA speaks up it joins.
    net.cas[1].mute = false;
    let t0 = net.now;
    assert!(
        net.run_until(30 * SEC, |n| n.cas[1].state == 4),
        "{:#?}",
        net.f.sm().unwrap().log()
    );
    assert!(
        net.now - t0 < 2 * SEC,
        "joined {} ms later",
        (net.now - t0) / 1_000_000
    );
    let lids: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    assert!(lids[1] != 0 && lids[1] != lids[0] && lids[1] != lids[2]);
}

#[test]
fn cable_pulled_and_reinserted_comes_back_active_with_its_lid() {
    let mut net = up(2);
    let lid = net.cas[0].lid;
    let sweeps = net.f.sm().unwrap().stats().heavy_sweeps;
    let p = net.cas[0].port;
    let now = net.now;
    net.f
        .schedule_unplug(p, now + SEC, Some(now + 2 * SEC))
        .unwrap();
    assert!(net.run_until(3 * SEC, |n| n.cas[0].state == 1 && n.now > now + SEC));
    assert_eq!(net.cas[0].lid, lid, "the port keeps its LID while down");
    assert!(
        net.run_until(30 * SEC, |n| n.cas[0].state == 4 && n.sm_master()),
        "{:#?}",
        net.f.sm().unwrap().log()
    );
    assert_eq!(net.cas[0].lid, lid, "same LID after the cable is back");
    let sm = net.f.sm().unwrap();
    assert!(
        sm.stats().heavy_sweeps > sweeps,
        "a heavy sweep followed the change"
    );
    assert!(
        sm.log()
            .iter()
            .any(|l| l.contains("port state change") || l.contains("trap 128"))
    );
    println!(
        "light sweep {} SMPs; heavy re-sweep {} SMPs",
        sm.stats().smps_last_light,
        sm.stats().smps_last_heavy
    );
    // The switch routes the LID to the port again.
    assert_eq!(net.f.switch(net.sw).unwrap().lft(lid), 1);
    assert!(gmp_crosses(&mut net, 1, 0));
}

#[test]
fn sm_restart_keeps_every_lid() {
    let mut net = up(3);
    let before: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    let sm_lid = net.f.sm().unwrap().lid();
    let sw_lid = net.f.switch(net.sw).unwrap().lid();
    net.f.restart_sm();
    assert!(
        net.f.sm().unwrap().lid_map().is_empty(),
        "a new SM knows nothing"
    );
    assert!(net.run_until(5 * SEC, |n| n.sm_master()));
    let sm = net.f.sm().unwrap();
    let after: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    assert_eq!(before, after);
    assert_eq!(sm.lid(), sm_lid);
    assert_eq!(net.f.switch(net.sw).unwrap().lid(), sw_lid);
    assert!(net.cas.iter().all(|c| c.state == 4));
    println!(
        "restarted SM: heavy sweep {} SMPs (all LFT blocks written again)",
        sm.stats().smps_last_heavy
    );
}

#[test]
fn light_sweeps_run_on_the_model_clock_and_cost_one_smp_per_switch() {
    let mut net = up(2);
    let st0 = net.f.sm().unwrap().stats().clone();
    net.run_for(35 * SEC);
    let st = net.f.sm().unwrap().stats().clone();
    assert_eq!(st.heavy_sweeps, st0.heavy_sweeps, "nothing changed");
    assert_eq!(st.light_sweeps - st0.light_sweeps, 3, "every 10 s");
    assert_eq!(st.smps_last_light, 1, "one SwitchInfo");
}

#[test]
fn trap_128_starts_a_heavy_sweep_at_once_and_is_repressed() {
    let mut net = up(2);
    let sweeps = net.f.sm().unwrap().stats().heavy_sweeps;
    let sm_lid = net.f.sm().unwrap().lid();
    let mut smp = Smp::lid_routed(0x4242, method::TRAP, 0x0002, 0);
    smp.data[0] = 0x80 | 1; // generic, urgent
    smp.data[4..6].copy_from_slice(&128u16.to_be_bytes());
    let issuer = net.cas[0].lid;
    smp.data[6..8].copy_from_slice(&issuer.to_be_bytes());
    let h = packet::mad_headers(sm_lid, issuer, 0, 0, 0xffff);
    let bytes = packet::build(&h, &smp.to_bytes()).unwrap();
    let p = net.cas[0].port;
    assert!(net.f.transmit(p, sim::fabric::Packet { bytes }, net.now));
    assert!(
        net.run_until(SEC, |n| n.f.sm().unwrap().stats().heavy_sweeps > sweeps
            && n.sm_master())
    );
    assert!(net.now < 11 * SEC, "not the periodic sweep");
    let got = net.take_mads(0);
    let rep = got
        .iter()
        .filter_map(|(_, m)| Smp::parse(m).ok())
        .find(|s| s.hdr.method == method::TRAP_REPRESS)
        .expect("TrapRepress");
    assert_eq!(rep.hdr.tid, 0x4242);
    assert_eq!(net.f.sm().unwrap().stats().traps, 1);
    // That sweep changed nothing, so it wrote no LFT block.
    let sm = net.f.sm().unwrap();
    let lft_writes = sm.log().iter().filter(|l| l.contains("LFT blocks")).count();
    assert_eq!(lft_writes, 1, "only the first sweep programs the LFT");
    println!(
        "heavy sweep that changes nothing: {} SMPs",
        sm.stats().smps_last_heavy
    );
}

#[test]
fn sminfo_and_the_sm_nodes_sma_answer_directed_route() {
    let mut net = up(2);
    let sm_port_on_switch = 3u8;
    let ask = |net: &mut Net, attr_id: u16, tid: u64| {
        let mut smp = Smp::dr_get(tid, attr_id, 0, &[1, sm_port_on_switch]).unwrap();
        smp.hop_ptr = 1;
        let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
        let bytes = packet::build(&h, &smp.to_bytes()).unwrap();
        let p = net.cas[0].port;
        net.f.transmit(p, sim::fabric::Packet { bytes }, net.now);
        net.run_for(10_000);
        net.take_mads(0)
            .into_iter()
            .filter_map(|(_, m)| Smp::parse(&m).ok())
            .find(|s| s.hdr.tid == tid)
            .expect("an answer")
    };
    let r = ask(&mut net, attr::SM_INFO, 1);
    assert_eq!(r.hdr.status, 0);
    assert!(r.direction);
    assert_eq!(r.hdr.method, method::GET_RESP);
    assert_eq!(
        &r.data[0..8],
        &(SM_GUID + 1).to_be_bytes(),
        "SMInfo GUID: the SM's port GUID"
    );
    assert_eq!(r.data[20] & 0xf, sm_state::MASTER);
    assert_eq!(r.data[20] >> 4, 15, "priority");
    let r = ask(&mut net, attr::NODE_INFO, 2);
    assert_eq!(r.data[2], 1, "a CA");
    assert_eq!(&r.data[12..20], &SM_GUID.to_be_bytes());
    let r = ask(&mut net, attr::PORT_INFO, 3);
    let sm_lid = net.f.sm().unwrap().lid();
    assert_eq!(&r.data[16..18], &sm_lid.to_be_bytes());
    assert_eq!(r.data[32] & 0xf, 4, "Active");
    assert_eq!(r.data[23] & 0x02, 0x02, "CapabilityMask IsSM");
    let r = ask(&mut net, 0x0099, 4);
    assert_eq!(r.hdr.status, packet::mad_status::ATTR_UNSUPPORTED);
    // A GMP of a class the SM's node does not serve: "bad version/class".
    let mut mad = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: mgmt_class::CM,
        class_version: 2,
        method: method::GET,
        tid: 9,
        ..MadHdr::default()
    }
    .write(&mut mad);
    assert!(net.send_gmp(0, sm_lid, &mad));
    net.run_for(10_000);
    let got = net.take_mads(0);
    let h = MadHdr::parse(&got[0].1).unwrap();
    assert_eq!(
        (h.method, h.status, h.tid),
        (method::GET_RESP, packet::mad_status::BAD_VERSION, 9)
    );
}

#[test]
fn a_new_sm_elsewhere_keeps_the_lids_the_ports_hold() {
    let mut net = up(2);
    let before: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    let old = net.f.remove_sm().unwrap();
    net.sinks.push(old.port());
    // Another SM node, on switch port 4, that would number from 0x40.
    let cfg = sim::fabric::SmConfig {
        node_guid: SM_GUID + 0x100,
        first_lid: 0x40,
        ..sim::fabric::SmConfig::default()
    };
    net.f.add_sm_on_switch(cfg, net.sw, 4).unwrap();
    assert!(net.run_until(10 * SEC, |n| n.sm_master()));
    let sm = net.f.sm().unwrap();
    let after: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    assert_eq!(before, after, "LIDs the ports report are kept");
    assert_eq!(sm.lid(), 0x40, "the new SM's own port gets a new LID");
    assert!(net.cas.iter().all(|c| c.sm_lid == 0x40 && c.state == 4));
    // The old SM's node no longer answers: reported, not a hang.
    assert!(sm.log().iter().any(|l| l.contains("no answer")));
    assert_ne!(old.lid(), 0);
}

/// Sends a GMP from CA `i` to CA `j` by LID and says whether it arrived.
fn gmp_crosses(net: &mut Net, i: usize, j: usize) -> bool {
    let mut mad = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: 0x09,
        class_version: 1,
        method: method::GET,
        tid: 1000 + j as u64,
        ..MadHdr::default()
    }
    .write(&mut mad);
    let dlid = net.cas[j].lid;
    net.send_gmp(i, dlid, &mad);
    net.run_for(10_000);
    net.take_mads(j).iter().any(|(p, m)| {
        p.hdr.lrh.slid == net.cas[i].lid && MadHdr::parse(m).unwrap().tid == 1000 + j as u64
    })
}

#[test]
fn two_switches_in_a_line_directed_routes_of_three_hops() {
    let t = sim::fabric::Topology::from_netfile(
        "Switch 8 \"S1\"\n[1] \"H1\"[1]\n[7] \"S2\"[7]\n\n\
         Switch 8 \"S2\"\n[1] \"H2\"[1]\n[7] \"S1\"[7]\n\n\
         Hca 1 \"H1\"\n[1] \"S1\"[1]\n\nHca 1 \"H2\"\n[1] \"S2\"[1]\n",
    )
    .unwrap();
    let mut net = Net::build(&t);
    assert!(
        net.run_until(5 * SEC, |n| n.sm_master()),
        "{:#?}",
        net.f.sm().unwrap().log()
    );
    assert!(net.cas.iter().all(|c| c.state == 4 && c.lid != 0));
    let sm = net.f.sm().unwrap();
    println!(
        "2 switches + 2 CAs: {} SMPs in the first heavy sweep",
        sm.stats().smps_last_heavy
    );
    assert_eq!(sm.subnet().len(), 5, "SM, 2 switches, 2 CAs");
    // The SM took S1's first free port (2); S2 reaches it over port 7.
    let (s1, s2) = (net.built_switch(0), net.built_switch(1));
    let sm_lid = sm.lid();
    let (h1, h2) = (net.cas[0].lid, net.cas[1].lid);
    let f = &net.f;
    assert_eq!(f.switch(s1).unwrap().lft(h1), 1);
    assert_eq!(f.switch(s1).unwrap().lft(h2), 7);
    assert_eq!(f.switch(s1).unwrap().lft(sm_lid), 2);
    assert_eq!(f.switch(s2).unwrap().lft(h2), 1);
    assert_eq!(f.switch(s2).unwrap().lft(h1), 7);
    assert_eq!(f.switch(s2).unwrap().lft(sm_lid), 7);
    let l1 = f.switch(s1).unwrap().lid();
    assert_eq!(f.switch(s2).unwrap().lft(l1), 7);
    assert!(gmp_crosses(&mut net, 0, 1) && gmp_crosses(&mut net, 1, 0));
}

#[test]
fn a_ring_of_three_switches_gets_min_hop_routes_without_looping() {
    let t = sim::fabric::Topology::from_netfile(
        "Switch 8 \"S1\"\n[1] \"H1\"[1]\n[5] \"S2\"[6]\n[6] \"S3\"[5]\n\n\
         Switch 8 \"S2\"\n[1] \"H2\"[1]\n[5] \"S3\"[6]\n[6] \"S1\"[5]\n\n\
         Switch 8 \"S3\"\n[1] \"H3\"[1]\n[5] \"S1\"[6]\n[6] \"S2\"[5]\n\n\
         Hca 1 \"H1\"\n[1] \"S1\"[1]\n\nHca 1 \"H2\"\n[1] \"S2\"[1]\n\nHca 1 \"H3\"\n[1] \"S3\"[1]\n",
    )
    .unwrap();
    let mut net = Net::build(&t);
    assert!(
        net.run_until(5 * SEC, |n| n.sm_master()),
        "{:#?}",
        net.f.sm().unwrap().log()
    );
    assert!(net.cas.iter().all(|c| c.state == 4));
    let sm = net.f.sm().unwrap();
    assert_eq!(sm.subnet().len(), 7);
    // Every CA is one switch-to-switch hop from every other: the direct link.
    let s3 = net.built_switch(2);
    let (h1, h2) = (net.cas[0].lid, net.cas[1].lid);
    assert_eq!(net.f.switch(s3).unwrap().lft(h1), 5, "S3 -> S1 directly");
    assert_eq!(net.f.switch(s3).unwrap().lft(h2), 6, "S3 -> S2 directly");
    for (i, j) in [(0, 1), (1, 2), (2, 0), (0, 2)] {
        assert!(gmp_crosses(&mut net, i, j), "{i} -> {j}");
    }
    assert_eq!(
        net.f
            .stats()
            .switch_drops
            .get("looping: too many switch hops"),
        None
    );
}

#[test]
fn the_first_sweep_of_an_sm_asks_ports_that_can_to_reregister() {
    let mut net = Net::star(2);
    net.cas[0].rereg_cap = true;
    assert!(net.run_until(5 * SEC, |n| n.sm_master()));
    assert_eq!((net.cas[0].reregs, net.cas[1].reregs), (1, 0));
    // Later sweeps do not; a restarted SM does again.
    let p = net.cas[1].port;
    let now = net.now;
    net.f
        .schedule_unplug(p, now + SEC, Some(now + 2 * SEC))
        .unwrap();
    net.run_for(30 * SEC);
    assert!(net.f.sm().unwrap().stats().heavy_sweeps >= 2);
    assert_eq!(net.cas[0].reregs, 1);
    net.f.restart_sm();
    assert!(net.run_until(5 * SEC, |n| n.sm_master()));
    assert_eq!(net.cas[0].reregs, 2);
    assert!(net.cas.iter().all(|c| c.state == 4));
}

#[test]
fn a_ca_silent_for_good_costs_a_backed_off_sweep_not_a_storm() {
    let mut net = Net::star(2);
    net.cas[1].mute = true;
    net.run_for(60 * SEC);
    let st = net.f.sm().unwrap().stats().clone();
    // Sweeps after 1, 2, 4, 8, then every 10 s (plus the time each takes):
    // about 8 in a minute, not 30.
    assert!(
        (6..=10).contains(&st.heavy_sweeps),
        "{} heavy sweeps in 60 s",
        st.heavy_sweeps
    );
    assert_eq!(net.cas[0].state, 4, "the other CA is up all along");
}

#[test]
fn the_sms_own_cable_pulled_and_back_resumes_without_a_new_lid() {
    let mut net = up(2);
    let sm_port = net.f.sm().unwrap().port();
    let sm_lid = net.f.sm().unwrap().lid();
    let sweeps = net.f.sm().unwrap().stats().heavy_sweeps;
    let now = net.now;
    net.f
        .schedule_unplug(sm_port, now + SEC, Some(now + 3 * SEC))
        .unwrap();
    net.run_for(2 * SEC);
    assert!(!net.f.sm().unwrap().sweeping(), "no sweep without a link");
    assert!(net.run_until(5 * SEC, |n| {
        let sm = n.f.sm().unwrap();
        sm.stats().heavy_sweeps > sweeps && !sm.sweeping()
    }));
    let sm = net.f.sm().unwrap();
    assert_eq!(sm.lid(), sm_lid);
    assert!(
        net.now < now + 4 * SEC,
        "swept as soon as the link was back: {} ms",
        (net.now - now) / 1_000_000
    );
    let sw = net.f.switch(net.sw).unwrap();
    assert_eq!(sw.port(3).unwrap().state, sim::fabric::LogicalState::Active);
    assert!(sm.log().iter().any(|l| l.contains("SM port link down")));
    assert!(gmp_crosses(&mut net, 0, 1));
}

#[test]
fn sminfo_by_lid_as_the_sminfo_tool_asks() {
    let mut net = up(2);
    let sm_lid = net.f.sm().unwrap().lid();
    let me = net.cas[0].lid;
    let smp = Smp::lid_routed(0x51, method::GET, attr::SM_INFO, 0);
    let h = packet::mad_headers(sm_lid, me, 0, 0, 0xffff);
    let bytes = packet::build(&h, &smp.to_bytes()).unwrap();
    let p = net.cas[0].port;
    assert!(net.f.transmit(p, sim::fabric::Packet { bytes }, net.now));
    net.run_for(10_000);
    let got = net.take_mads(0);
    let (pk, m) = got.first().expect("an answer by LID");
    assert_eq!(
        (pk.hdr.lrh.slid, pk.hdr.lrh.dlid, pk.hdr.lrh.vl),
        (sm_lid, me, 15)
    );
    let r = Smp::parse(m).unwrap();
    assert_eq!(
        (r.hdr.method, r.hdr.status, r.hdr.tid),
        (method::GET_RESP, 0, 0x51)
    );
    assert_eq!(&r.data[0..8], &(SM_GUID + 1).to_be_bytes());
    assert_eq!(r.data[20], 15 << 4 | sm_state::MASTER);
    // The same to a LID nobody has: the switch drops it, no answer.
    let h = packet::mad_headers(0x300, me, 0, 0, 0xffff);
    let bytes = packet::build(&h, &smp.to_bytes()).unwrap();
    net.f.transmit(p, sim::fabric::Packet { bytes }, net.now);
    net.run_for(10_000);
    assert!(net.take_mads(0).is_empty());
}

use super::*;

fn tool(name: &str) -> Tool {
    Tool::from_name(name).expect("known tool")
}

fn parse(name: &str, line: &str) -> Result<Params, ParseError> {
    let args: Vec<&str> = line.split_whitespace().collect();
    Params::parse(tool(name), &args)
}

#[test]
fn every_tool_has_its_name_back() {
    for (name, t) in TOOLS {
        assert_eq!(t.name(), name);
        assert_eq!(Tool::from_name(name), Some(t));
    }
    assert_eq!(Tool::from_name("ib_write"), None);
}

#[test]
fn server_without_peer_client_with_lid_or_guid() {
    let s = parse("ib_write_bw", "").unwrap();
    assert!(s.is_server());
    assert_eq!(
        (s.size, s.iters, s.tx_depth, s.cq_mod),
        (65536, 5000, 128, 100)
    );
    let c = parse("ib_write_bw", "3").unwrap();
    assert_eq!(c.peer, Some(Peer::Lid(3)));
    assert_eq!(
        parse("ib_read_lat", "0x1f").unwrap().peer,
        Some(Peer::Lid(0x1f))
    );
    assert_eq!(
        parse("ib_send_bw", "0x0002c903000a1b2c").unwrap().peer,
        Some(Peer::Guid(0x0002_c903_000a_1b2c))
    );
    assert_eq!(
        parse("ib_send_bw", "0002:c903:000a:1b2c").unwrap().peer,
        Some(Peer::Guid(0x0002_c903_000a_1b2c))
    );
    let l = parse("ib_send_lat", "").unwrap();
    assert_eq!((l.size, l.iters, l.tx_depth, l.rx_depth), (2, 1000, 1, 512));
    assert_eq!(parse("ib_atomic_lat", "").unwrap().size, 8);
}

#[test]
fn sizes_iterations_and_all() {
    let p = parse("ib_write_bw", "-s 64K -n 100 --check 2").unwrap();
    assert_eq!((p.size, p.iters, p.check), (65536, 100, true));
    assert_eq!(p.sizes().collect::<Vec<_>>(), vec![65536]);
    let p = parse("ib_write_bw", "--size=1M --iters=10").unwrap();
    assert_eq!((p.size, p.iters), (1 << 20, 10));
    let p = parse("ib_write_bw", "-s4096 -n5").unwrap();
    assert_eq!((p.size, p.iters), (4096, 5));
    let a = parse("ib_read_bw", "-a").unwrap();
    let sizes: Vec<u64> = a.sizes().collect();
    assert_eq!(sizes.len(), 23);
    assert_eq!((sizes[0], sizes[22]), (2, 1 << 23));
    assert_eq!(a.max_size(), MAX_SIZE);
    let d = parse("ib_send_bw", "-D 3 1").unwrap();
    assert_eq!(d.duration, Some(3));
    // CQ moderation never exceeds the send queue depth.
    assert_eq!(parse("ib_write_bw", "-t 16").unwrap().cq_mod, 16);
    assert_eq!(
        parse("ib_atomic_lat", "-A CMP_AND_SWAP")
            .unwrap()
            .atomic_type,
        AtomicType::CmpAndSwap
    );
}

#[test]
fn bad_options_are_refused_with_a_reason() {
    let e = |n: &str, l: &str| parse(n, l).unwrap_err().to_string();
    assert!(e("ib_write_bw", "-n 4").contains("5 to 1048576"));
    assert!(e("ib_write_bw", "-s 0").contains("1 to 8388608"));
    assert!(e("ib_write_bw", "-s 9M").contains("1 to 8388608"));
    assert!(e("ib_write_bw", "-s abc").contains("'abc'"));
    assert!(e("ib_write_bw", "-s").contains("needs a value"));
    assert!(e("ib_write_bw", "-y").contains("unknown option"));
    assert!(e("ib_write_bw", "-x").contains("needs a value"));
    assert!(e("ib_write_bw", "-a -s 64").contains("-a"));
    assert!(e("ib_write_bw", "-D 2 -n 10").contains("-D"));
    assert!(e("ib_atomic_lat", "-s 64").contains("8 bytes"));
    assert!(e("ib_write_bw", "0").contains("not a unicast LID"));
    assert!(e("ib_write_bw", "0xc000").contains("not a unicast LID"));
    assert!(e("ib_write_bw", "1 2").contains("one peer"));
    assert!(e("ib_write_bw", "12:34").contains("neither a LID"));
    assert!(e("ib_write_bw", "zz").contains("neither a LID"));
    assert_eq!(parse("ib_write_bw", "-h"), Err(ParseError::Help));
    assert!(usage(tool("ib_send_lat")).starts_with("usage: ib_send_lat"));
}

#[test]
fn header_block_as_perftest_prints_it() {
    let p = parse("ib_write_bw", "1").unwrap();
    let link = LinkInfo {
        ib_dev: "mlx4_0".into(),
        mtu: 2048,
        link_type: "IB",
    };
    let mut s = String::new();
    print_test_info(&mut s, &p, &link).unwrap();
    let want = format!(
        "{RESULT_LINE}\n                    RDMA_Write BW Test\n Dual-port       : OFF\t\tDevice         : mlx4_0\n Number of qps   : 1\t\tTransport type : IB\n Connection type : RC\t\tUsing SRQ      : OFF\n TX depth        : 128\n CQ Moderation   : 100\n Mtu             : 2048[B]\n Link type       : IB\n Max inline data : 0[B]\n rdma_cm QPs\t : OFF\n Data ex. method : IB CM\n{RESULT_LINE}\n"
    );
    assert_eq!(s, want);

    let p = parse("ib_atomic_lat", "").unwrap();
    let mut s = String::new();
    print_test_info(&mut s, &p, &link).unwrap();
    assert!(s.contains("                    Atomic FETCH_AND_ADD Latency Test\n"));
    assert!(s.contains(" Outstand reads  : 16\n"));
    assert!(!s.contains("TX depth"), "the server prints no TX depth");
    assert!(
        !s.contains("CQ Moderation"),
        "latency tests print no CQ moderation"
    );
}

#[test]
fn address_lines_as_perftest_prints_them() {
    let d = Dest {
        lid: 1,
        qpn: 0x4a,
        psn: 0x7a2d2c,
        rkey: 0x2800_4000,
        vaddr: 0x7f12_3456_7000,
        out_reads: 16,
    };
    let mut s = String::new();
    print_pingpong_data(&mut s, false, Verb::Write, &d).unwrap();
    assert_eq!(
        s,
        " local address: LID 0x01 QPN 0x004a PSN 0x7a2d2c RKey 0x28004000 VAddr 0x007f1234567000\n"
    );
    let mut s = String::new();
    print_pingpong_data(&mut s, true, Verb::Read, &d).unwrap();
    assert_eq!(
        s,
        " remote address: LID 0x01 QPN 0x004a PSN 0x7a2d2c OUT 0x10 RKey 0x28004000 VAddr 0x007f1234567000\n"
    );
    let mut s = String::new();
    print_pingpong_data(&mut s, false, Verb::Send, &d).unwrap();
    assert_eq!(s, " local address: LID 0x01 QPN 0x004a PSN 0x7a2d2c\n");
}

#[test]
fn bandwidth_in_mebibytes_and_mpps() {
    // 1000 messages of 64 KiB, one every microsecond: 1 ms in all.
    let posted: Vec<u64> = (0..1000).map(|i| i * 1000).collect();
    let completed: Vec<u64> = (0..1000).map(|i| (i + 1) * 1000).collect();
    let r = bw_report(65536, &posted, &completed, 100, 1_000_000_000).unwrap();
    // 65536 * 1000 bytes in 1 ms = 62500 * 2^20 bytes per second.
    assert!((r.bw_avg - 62500.0).abs() < 1e-6, "{}", r.bw_avg);
    assert!((r.bw_peak - 62500.0).abs() < 1e-6, "{}", r.bw_peak);
    assert!((r.msg_rate - 1.0).abs() < 1e-9);
    let mut s = String::new();
    print_bw_line(&mut s, &r).unwrap();
    assert_eq!(
        s,
        " 65536      1000             62500.00            62500.00\t\t   1.000000\n"
    );
    assert_eq!(
        RESULT_FMT,
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    );
}

#[test]
fn peak_is_the_best_window_ending_on_a_signalled_completion() {
    // 200 messages; the first hundred goes twice as fast.
    let mut posted = Vec::new();
    let mut completed = Vec::new();
    for i in 0..200u64 {
        let t = if i < 100 {
            i * 1000
        } else {
            100_000 + (i - 100) * 2000
        };
        posted.push(t);
        completed.push(t + if i < 100 { 1000 } else { 2000 });
    }
    let r = bw_report(4096, &posted, &completed, 100, 1_000_000_000).unwrap();
    let avg = 4096.0 * 200.0 / (300e-6 * 1_048_576.0);
    let peak = 4096.0 / (1e-6 * 1_048_576.0);
    assert!((r.bw_avg - avg).abs() < 1e-6);
    assert!((r.bw_peak - peak).abs() < 1e-6, "{} vs {}", r.bw_peak, peak);
    // With one completion per 200 the fast half alone is no window: the
    // best is the whole run, 1.5 us per message.
    let r = bw_report(4096, &posted, &completed, 200, 1_000_000_000).unwrap();
    assert!(
        (r.bw_peak - 4096.0 / (1.5e-6 * 1_048_576.0)).abs() < 1e-6,
        "{}",
        r.bw_peak
    );
}

#[test]
fn bandwidth_refuses_what_it_cannot_measure() {
    assert_eq!(
        bw_report(8, &[0, 1], &[5], 1, 1_000_000_000),
        Err(StatsError::TooFewSamples { have: 1, need: 2 })
    );
    assert_eq!(
        bw_report(8, &[7], &[7], 1, 1_000_000_000),
        Err(StatsError::ZeroTime)
    );
    assert_eq!(
        bw_report(8, &[7], &[3], 1, 1_000_000_000),
        Err(StatsError::NonMonotonic)
    );
    assert_eq!(bw_report_duration(8, 10, 0, 1), Err(StatsError::ZeroTime));
    let d = bw_report_duration(65536, 16000, 1_000_000_000, 1_000_000_000).unwrap();
    assert_eq!(d.bw_peak, 0.0);
    assert!((d.bw_avg - 1000.0).abs() < 1e-9);
}

#[test]
fn latency_median_percentiles_tail_as_perftest() {
    // 102 samples of 1..=102 us (nanosecond ticks); RDMA READ: no halving.
    let mut s: Vec<u64> = (1..=102u64).rev().map(|k| k * 1000).collect();
    let r = lat_report(8, 103, &mut s, Verb::Read, 1_000_000_000).unwrap();
    assert_eq!(r.t_min, 1.0);
    // Two dropped: 100 kept; t_max is the sample just past them.
    assert_eq!(r.t_max, 101.0);
    // 100 kept, (n-1) odd: the mean of the two middle samples.
    assert_eq!(r.t_typical, 50.5);
    assert!((r.t_avg - 50.5).abs() < 1e-12);
    assert!(
        (r.t_stdev - (833.25f64).sqrt()).abs() < 1e-9,
        "{}",
        r.t_stdev
    );
    assert_eq!(r.p99, 100.0);
    assert_eq!(r.p99_9, 101.0);

    // Write ping-pong: each sample is a round trip, halved.
    let mut s: Vec<u64> = (1..=102u64).map(|k| k * 1000).collect();
    let w = lat_report(2, 103, &mut s, Verb::Write, 1_000_000_000).unwrap();
    assert_eq!((w.t_min, w.t_typical, w.p99), (0.5, 25.25, 50.0));

    // An odd number kept: the middle one.
    let mut s: Vec<u64> = vec![3000, 1000, 2000, 9000, 9000];
    let o = lat_report(2, 6, &mut s, Verb::Atomic, 1_000_000_000).unwrap();
    assert_eq!(o.t_typical, 2.0);

    let mut s = String::new();
    print_lat_line(&mut s, &r).unwrap();
    assert_eq!(
        s,
        " 8       103          1.00           101.00       50.50    \t       50.50       \t28.87  \t\t100.00  \t\t101.00 \n"
    );
}

#[test]
fn latency_refuses_what_it_cannot_measure() {
    let mut s = vec![1u64, 2];
    assert_eq!(
        lat_report(2, 3, &mut s, Verb::Send, 1_000_000_000),
        Err(StatsError::TooFewSamples { have: 2, need: 3 })
    );
    let mut s = vec![1u64, 2, 3];
    assert_eq!(
        lat_report(2, 4, &mut s, Verb::Send, 0),
        Err(StatsError::ZeroTime)
    );
    let mut out = String::new();
    print_lat_duration_line(&mut out, 2, 1000, 2_000_000, Verb::Write, 1_000_000_000).unwrap();
    // 1000 round trips in 2 ms: 1 usec one way, 500000 per second.
    assert_eq!(
        out,
        " 2             1000            1.00           500000.00\n"
    );
}

#[test]
fn a_peer_given_by_gid_and_a_gid_index() {
    let g = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0x00, 0x10, 0x01,
    ];
    let c = parse("ib_write_bw", "-g 1 fe80::202:c9ff:fe00:1001").unwrap();
    assert_eq!((c.peer, c.gid_index), (Some(Peer::Gid(g)), Some(1)));
    // show_gids' eight groups, and perftest's own -x.
    let c = parse(
        "ib_read_lat",
        "-x 0 fe80:0000:0000:0000:0202:c9ff:fe00:1001",
    )
    .unwrap();
    assert_eq!((c.peer, c.gid_index), (Some(Peer::Gid(g)), Some(0)));
    let v4 = parse("ib_send_bw", "::ffff:a00:2").unwrap().peer;
    let mut m = [0u8; 16];
    m[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 2]);
    assert_eq!(v4, Some(Peer::Gid(m)));
    assert_eq!(parse("ib_send_bw", "").unwrap().gid_index, None);
    for bad in [
        "fe80::1::2",
        "fe80:0:0:0:0:0:0:0:1",
        "fe80::12345",
        "1:2:3:4:5:6:7:g",
    ] {
        assert!(
            matches!(parse("ib_write_bw", bad), Err(ParseError::BadPeer(_))),
            "{bad}"
        );
    }
    assert!(
        parse("ib_write_bw", "-g 128 fe80::1").is_err(),
        "a GID index above 127"
    );
}

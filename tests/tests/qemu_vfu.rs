//! End-to-end: our kernel against the model served over vfio-user.
//!
//! End-to-end: our kernel against the model served as a real PCI function
//! over vfio-user (`cx3-vfu`, `run-qemu.sh --vfu`): the function is probed as
//! a plain PCI device with no ivshmem glue, the path a passed-through card
//! takes. Plus the transport benchmark (ivshmem vs vfio-user), `#[ignore]`d:
//! `cargo test --release -p tests --test qemu_vfu -- --ignored --nocapture`.

use std::time::Duration;

use tests::qemu;

const DEADLINE: Duration = Duration::from_secs(180);

/// `run-qemu.sh OPTS --run CMDS` (cx3-vfu's messages on stderr).
fn run(opts: &[&str], cmds: &str) -> qemu::Run {
    qemu::run_vfu(&[&["--run", cmds], opts].concat(), DEADLINE, false)
}

#[test]
fn our_kernel_probes_the_vfio_user_function_as_a_plain_pci_device() {
    let o = run(
        &["--vfu", "--emu-args", "--stats"],
        "lspci; ibv_devinfo; ibstat; mlx4 catas",
    );
    let all = format!("{}\n--- cx3-vfu ---\n{}", o.transcript, o.stderr);
    assert_eq!(o.status, 0, "{all}");
    for want in [
        // Found by enumeration as the card itself, not as an ivshmem window.
        "00:02.0 Network controller: Mellanox Technologies MT27500 Family [ConnectX-3]",
        "mlx4_core 00:02.0: ConnectX-3 ready: fw_ver 2.42.5000",
        "mlx4_0: mlx4_core ready in",
        "hca_id:\tmlx4_0",
        "\tfw_ver:\t\t\t\t2.42.5000",
        // Node 0 of the fabric's topology, as under cx3-emu.
        "\tnode_guid:\t\t\t0002:c903:0000:0010",
        "CA 'mlx4_0'",
        "internal error buffer at BAR0 + 0xa0000, 16 dwords: clear",
        "run: all commands succeeded",
    ] {
        assert!(o.transcript.contains(want), "expected {want:?}:\n{all}");
    }
    assert!(!o.transcript.contains("ivshmem: emulated HCA"), "{all}");
    // The model saw the whole bring-up, every access trapped, and nothing
    // wrong with it.
    assert!(o.stderr.contains("violations 0, DMA faults 0"), "{all}");
    assert!(!o.stderr.contains("BAR0 0,"), "{all}");
}

#[test]
fn fault_injection_reaches_our_kernel_over_vfio_user() {
    let o = run(
        &["--vfu", "--emu-args", "--fail QUERY_DEV_CAP=BAD_PARAM"],
        "ibv_devinfo",
    );
    let all = format!("{}\n--- cx3-vfu ---\n{}", o.transcript, o.stderr);
    assert_eq!(o.status, 1, "ibv_devinfo must fail without an HCA:\n{all}");
    assert!(
        o.transcript
            .contains("bring-up failed: command QUERY_DEV_CAP (0x3) failed: fw status = 0x3"),
        "{all}"
    );
    assert!(o.transcript.contains("ibv_devinfo: no HCA"), "{all}");
}

/// Two of our guests over vfio-user, each HCA's UAR pages mapped into its
/// guest: `ib_write_bw` and `ib_write_lat` between them run with every
/// doorbell a plain store (no BAR2 message reaches cx3-vfu, which takes the
/// doorbells from the pages), no INTx (mlx4_core polls and disables it:
/// QEMU would trap the mapped pages again at the first one), and nothing
/// wrong in the model's eyes.
#[test]
fn our_doorbells_over_vfio_user_are_stores_into_the_mapped_uar_pages() {
    let o = qemu::run_vfu(
        &[
            "--vfu",
            "--nodes",
            "2",
            "--emu-args",
            "--stats",
            "--run-on",
            "0",
            "ib_write_bw -s 65536 -n 300; ib_write_lat -s 8 -n 200",
            "--run-on",
            "1",
            "retry -n 30 -i 1 ib_write_bw -s 65536 -n 300 3; \
             retry -n 30 -i 1 ib_write_lat -s 8 -n 200 3",
        ],
        Duration::from_secs(100),
        false,
    );
    let all = format!("{}\n--- cx3-vfu ---\n{}", o.transcript, o.stderr);
    assert_eq!(o.status, 0, "{all}");
    // The client prints the figures (our RDMA WRITE servers print none).
    let client = qemu::node(&o.transcript, 1).unwrap_or("");
    assert!(client.contains(" 65536      300 "), "ib_write_bw:\n{all}");
    assert!(client.contains(" 8       200 "), "ib_write_lat:\n{all}");
    for n in 0..2 {
        let a = qemu::vfu_accesses(&o.stderr, n);
        assert_eq!(
            qemu::count_after(a, "BAR2 "),
            Some(0),
            "node {n}: {a}\n{all}"
        );
        assert!(
            qemu::count_after(a, "mapped: ").is_some_and(|p| p > 0),
            "node {n}: doorbells taken from the pages: {a}\n{all}"
        );
        assert_eq!(
            qemu::count_after(a, "INTx "),
            Some(0),
            "node {n}: {a}\n{all}"
        );
    }
    assert!(
        o.stderr.contains("total: commands") && o.stderr.contains("violations 0, DMA faults 0;"),
        "{all}"
    );
}

/// Boot to "mlx4_core ready", firmware command round trip, register read
/// and doorbell store on both transports; prints the figures.
#[test]
#[ignore = "benchmark: prints figures (cargo test --release -p tests --test qemu_vfu -- --ignored --nocapture)"]
fn transport_figures_ivshmem_vs_vfio_user() {
    for (name, opts) in [
        ("ivshmem (cx3-emu)", &[][..]),
        ("vfio-user (cx3-vfu)", &["--vfu"][..]),
    ] {
        for round in 1..=3 {
            let o = run(opts, "mlx4 bench 2000");
            assert_eq!(o.status, 0, "{}\n{}", o.transcript, o.stderr);
            let ready = o
                .transcript
                .lines()
                .find(|l| l.contains("mlx4_core ready in"))
                .unwrap_or("");
            let bench = o
                .transcript
                .lines()
                .find(|l| l.contains("rounds: firmware command"))
                .unwrap_or("");
            println!("{name} #{round}: {}", ready.trim());
            println!("{name} #{round}: {}", bench.trim());
        }
    }
}

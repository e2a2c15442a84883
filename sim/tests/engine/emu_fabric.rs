//! cx3-emu's fabric: the command line takes the fabric's options and one
//! fabric spans every node, each node's HCA cabled where the topology says.

use std::fs::File;

use sim::front::host::Log;
use sim::front::ivshmem::{Emulator, parse_args};

fn files(tag: &str, n: u32) -> (std::path::PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("engine-emu-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = Vec::new();
    for i in 0..n {
        let w = dir.join(format!("node{i}.win"));
        let r = dir.join(format!("node{i}.ram"));
        File::create(&w).unwrap().set_len(16 << 20).unwrap();
        File::create(&r).unwrap().set_len(16 << 20).unwrap();
        args.push("--node".to_string());
        args.push(format!("{},{}", w.display(), r.display()));
    }
    (dir, args)
}

#[test]
fn one_fabric_spans_every_node() {
    // Default: one switch, every node's port 1 on it.
    let (dir, args) = files("switch", 3);
    let Ok((nodes, opts)) = parse_args(args) else {
        panic!("arguments refused")
    };
    let emu = Emulator::open(&nodes, opts, Log::capture()).unwrap();
    let f = emu.fabric();
    for n in emu.nodes() {
        let p1 = n.hca().fabric_port(1).expect("port 1 on the fabric");
        let peer = f.lock().unwrap().peer(p1).expect("cabled");
        assert!(
            matches!(
                f.lock().unwrap().owner(peer),
                Some(sim::fabric::Owner::Switch { .. })
            ),
            "node {} port 1 goes to the switch",
            n.id()
        );
        let p2 = n.hca().fabric_port(2).unwrap();
        assert_eq!(f.lock().unwrap().peer(p2), None, "port 2 uncabled");
    }
    drop(emu);
    // --back-to-back with a capture file: node 0 port 1 to node 1 port 1.
    let (dir2, mut args) = files("b2b", 2);
    let cap = dir2.join("wire.pcap");
    args.extend([
        "--back-to-back".to_string(),
        "--capture".to_string(),
        cap.display().to_string(),
        "--latency".to_string(),
        "2us".to_string(),
    ]);
    let Ok((nodes, opts)) = parse_args(args) else {
        panic!("arguments refused")
    };
    let emu = Emulator::open(&nodes, opts, Log::capture()).unwrap();
    let (a, b) = (
        emu.nodes()[0].hca().fabric_port(1).unwrap(),
        emu.nodes()[1].hca().fabric_port(1).unwrap(),
    );
    assert_eq!(emu.fabric().lock().unwrap().peer(a), Some(b));
    assert_eq!(emu.fabric().lock().unwrap().latency_ns, 2000);
    assert!(cap.exists(), "capture file created");
    drop(emu);
    // Three nodes cannot be back to back; unknown flags are refused.
    let (dir3, mut args) = files("bad", 3);
    args.push("--back-to-back".into());
    let Ok((nodes, opts)) = parse_args(args.clone()) else {
        panic!("arguments refused")
    };
    assert!(Emulator::open(&nodes, opts, Log::capture()).is_err());
    args.push("--no-such-flag".into());
    assert!(parse_args(args).is_err());
    for d in [dir, dir2, dir3] {
        let _ = std::fs::remove_dir_all(d);
    }
}

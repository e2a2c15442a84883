//! infiniband-diags from `ib_tools` against the real stack on the model.
//!
//! infiniband-diags from `ib_tools` against the real stack (mlx4_core + mlx4_ib +
//! ib_core on the model): `smpquery` to this port goes through ib_core's SMI to
//! mlx4_ib's MAD_IFC and the model's firmware SMA, and prints what the device says
//! in libibmad's words; the queries that need a subnet (a LID, an SM) end with a
//! clear error. Two HCAs through the switch (perfquery of the peer, the switch in
//! smpquery, ibnetdiscover) wait for the model's data path and an SM on main.

use tests::mlx4_common;

use ib_core::{DeviceId, IbCore};
use ib_tools::diags::{self, Src};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;

struct Stack {
    core: IbCore,
    id: DeviceId,
}

fn up(model: &Model) -> Stack {
    let dev = bring_up(model, Profile::default()).expect("mlx4_core up");
    let ib = Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(model.clock());
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Stack { core, id }
}

fn down(mut s: Stack) {
    let mut provider = s.core.unregister_device(s.id).expect("unregistered");
    let ib = provider
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    ib.remove();
}

type Tool = fn(&mut IbCore, Src, &[&str], &mut dyn std::fmt::Write) -> Result<(), String>;

fn run(s: &mut Stack, port: u8, tool: Tool, args: &[&str]) -> Result<String, String> {
    let mut out = String::new();
    tool(&mut s.core, Src { dev: s.id, port }, args, &mut out).map(|()| out)
}

#[test]
fn smpquery_of_this_port_prints_what_the_firmware_sma_says() {
    let model = sync_hca();
    let mut s = up(&model);
    let guid = s.core.device(s.id).unwrap().info().node_guid;

    let t = run(&mut s, 1, diags::smpquery, &["nodeinfo"]).expect("nodeinfo");
    assert!(
        t.starts_with("# Node info: DR path slid 65535; dlid 65535; 0\n"),
        "{t}"
    );
    assert!(
        t.contains("NodeType:........................Channel Adapter\n"),
        "{t}"
    );
    assert!(t.contains("NumPorts:........................2\n"), "{t}");
    assert!(
        t.contains(&format!("Guid:............................{guid:#018x}\n")),
        "{t}"
    );
    assert!(
        t.contains("DevId:...........................0x1003\n"),
        "{t}"
    );
    assert!(
        t.contains("VendorId:........................0x0002c9\n"),
        "{t}"
    );
    // The same through an explicit directed route of this port.
    let d = run(&mut s, 1, diags::smpquery, &["-D", "nodeinfo", "0"]).expect("-D 0");
    assert_eq!(d, t);
    // From port 2 the SMA answers for port 2.
    let t2 = run(&mut s, 2, diags::smpquery, &["nodeinfo"]).expect("port 2");
    assert!(t2.contains("LocalPort:.......................2\n"), "{t2}");

    let t = run(&mut s, 1, diags::smpquery, &["nodedesc"]).expect("nodedesc");
    assert!(t.starts_with("Node Description:"), "{t}");
    assert!(
        t.trim_end().len() > "Node Description:.".len(),
        "a description: {t}"
    );

    let t = run(&mut s, 1, diags::smpquery, &["portinfo"]).expect("portinfo");
    assert!(
        t.starts_with("# Port info: DR path slid 65535; dlid 65535; 0 port 1\n"),
        "{t}"
    );
    // No SM has been here: the link is up, the port is not Active, no LID.
    assert!(
        t.contains("LinkState:.......................Initialize\n"),
        "{t}"
    );
    assert!(
        t.contains("PhysLinkState:...................LinkUp\n"),
        "{t}"
    );
    assert!(t.contains("Lid:.............................0\n"), "{t}");
    assert!(
        t.contains("GidPrefix:.......................0xfe80000000000000\n"),
        "{t}"
    );
    let t = run(&mut s, 1, diags::smpquery, &["portinfo", "0", "2"]);
    // A LID destination of 0 is refused before anything is sent.
    assert!(t.unwrap_err().contains("not a unicast LID"));
    let t = run(&mut s, 1, diags::smpquery, &["-D", "portinfo", "0", "2"]).expect("port 2");
    assert!(
        t.starts_with("# Port info: DR path slid 65535; dlid 65535; 0 port 2\n"),
        "{t}"
    );

    down(s);
    model.finish();
}

#[test]
fn queries_that_need_a_subnet_say_so() {
    let model = sync_hca();
    let mut s = up(&model);
    let e = run(&mut s, 1, diags::sminfo, &[]).unwrap_err();
    assert!(e.contains("knows no subnet manager"), "{e}");
    let e = run(&mut s, 1, diags::perfquery, &[]).unwrap_err();
    assert!(e.contains("no LID yet"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &["bogus"]).unwrap_err();
    assert!(e.contains("unknown operation 'bogus'"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &[]).unwrap_err();
    assert!(e.starts_with("usage: smpquery"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &["-D", "nodeinfo", "1,2"]).unwrap_err();
    assert!(e.contains("must start at this port"), "{e}");
    let e = run(&mut s, 1, diags::perfquery, &["-q"]).unwrap_err();
    assert!(e.contains("unknown option '-q'"), "{e}");
    // The ports each takes, in its message (perfquery's 255 is "all
    // ports"; no node has a port 255 to ask the SMA about), refused before
    // anything is sent.
    let e = run(&mut s, 1, diags::perfquery, &["1", "256"]).unwrap_err();
    assert_eq!(e, "bad port '256' (0 to 254, or 255 for all ports)");
    let e = run(&mut s, 1, diags::smpquery, &["-D", "portinfo", "0", "255"]).unwrap_err();
    assert_eq!(e, "bad port '255' (0 to 254)");
    down(s);
    model.finish();
}

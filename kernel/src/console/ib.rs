//! The InfiniBand commands of the shell.
//!
//! `ibv_devices`, `ibv_devinfo`, `ibstat`, `show_gids`, `mlx4`, `fwtrace`. Devices and ports are
//! read through ib_core's verbs (query_device, query_port, query_gid), as the Linux
//! tools read them through libibverbs and libibumad; field names, words and numbers
//! follow rdma-core's `ibv_devices`/`ibv_devinfo` and infiniband-diags' `ibstat`.

use alloc::string::{String, ToString};
use core::fmt::Write;

use ib_core::Device;
use ib_core::verbs::{DeviceAttr, LinkLayer, PortAttr};
use mlx4_ib::Mlx4IbDev;

use crate::console::CmdResult;
use crate::hca::{self, Guid, Hca, Ib};

const NO_HCA: &str = "no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)";

/// Runs `f` on every registered HCA, or only on the one named `only`; no
/// HCA at all, or no HCA of that name, is an error (`missing` words the
/// latter).
fn for_devices(
    only: Option<&str>,
    missing: impl FnOnce(&str) -> String,
    mut f: impl FnMut(&Hca, &mut Device) -> CmdResult,
) -> CmdResult {
    hca::with(|ib| {
        let Ib { core, hcas, .. } = ib;
        let mut found = false;
        let mut any = false;
        for h in hcas.iter() {
            let Some(dev) = h.id.and_then(|id| core.device_mut(id)) else {
                continue;
            };
            any = true;
            if only.is_some_and(|n| n != h.name) {
                continue;
            }
            found = true;
            f(h, dev)?;
        }
        if !any {
            return Err(NO_HCA.to_string());
        }
        match only {
            Some(name) if !found => Err(missing(name)),
            _ => Ok(()),
        }
    })
    .unwrap_or_else(|| Err(NO_HCA.to_string()))
}

fn device_attr(h: &Hca, dev: &mut Device) -> Result<DeviceAttr, String> {
    dev.query_device()
        .map_err(|e| alloc::format!("{}: query_device failed: {e}", h.name))
}

fn port_attr(h: &Hca, dev: &mut Device, port: u8) -> Result<PortAttr, String> {
    dev.query_port(port)
        .map_err(|e| alloc::format!("{}: query_port failed: {e}", h.name))
}

/// GUID 0 of the port (the low half of GID 0).
fn port_guid(h: &Hca, dev: &mut Device, port: u8) -> Result<u64, String> {
    let g = dev
        .query_gid(port, 0)
        .map_err(|e| alloc::format!("{}: query_gid failed: {e}", h.name))?;
    let mut b = [0u8; 8];
    b.copy_from_slice(&g.0[8..]);
    Ok(u64::from_be_bytes(b))
}

fn board_id(dev: &mut Device) -> String {
    dev.provider_as::<Mlx4IbDev>()
        .map(|m| m.core().board_id().to_string())
        .unwrap_or_default()
}

fn devinfo(out: &mut dyn Write, h: &Hca, dev: &mut Device, verbose: bool) -> CmdResult {
    let a = device_attr(h, dev)?;
    let node_guid = dev.info().node_guid;
    let nports = dev.phys_port_cnt();
    let _ = writeln!(out, "hca_id:\t{}", h.name);
    let _ = writeln!(out, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(out, "\tfw_ver:\t\t\t\t{}", hca::fw_ver(a.fw_ver));
    let _ = writeln!(out, "\tnode_guid:\t\t\t{}", Guid(node_guid));
    let _ = writeln!(out, "\tsys_image_guid:\t\t\t{}", Guid(a.sys_image_guid));
    let _ = writeln!(out, "\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    let _ = writeln!(out, "\tvendor_part_id:\t\t\t{}", h.pci.device);
    let _ = writeln!(out, "\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    let _ = writeln!(out, "\tboard_id:\t\t\t{}", board_id(dev));
    let _ = writeln!(out, "\tphys_port_cnt:\t\t\t{nports}");
    if verbose {
        let _ = writeln!(out, "\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
        let _ = writeln!(out, "\tpage_size_cap:\t\t\t{:#x}", a.page_size_cap);
        let _ = writeln!(out, "\tmax_qp:\t\t\t\t{}", a.max_qp);
        let _ = writeln!(out, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        let _ = writeln!(out, "\tmax_sge:\t\t\t{}", a.max_sge);
        let _ = writeln!(out, "\tmax_cq:\t\t\t\t{}", a.max_cq);
        let _ = writeln!(out, "\tmax_cqe:\t\t\t{}", a.max_cqe);
        let _ = writeln!(out, "\tmax_mr:\t\t\t\t{}", a.max_mr);
        let _ = writeln!(out, "\tmax_pd:\t\t\t\t{}", a.max_pd);
        let _ = writeln!(out, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        let _ = writeln!(out, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        let _ = writeln!(out, "\tmax_srq:\t\t\t{}", a.max_srq);
        let _ = writeln!(out, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        let _ = writeln!(out, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        let _ = writeln!(out, "\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        let _ = writeln!(out, "\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
    }
    for port_num in 1..=nports {
        let p = port_attr(h, dev, port_num)?;
        let _ = writeln!(out, "\t\tport:\t{port_num}");
        let _ = writeln!(
            out,
            "\t\t\tstate:\t\t\t{} ({})",
            p.state.ibv_str(),
            p.state.raw()
        );
        let _ = writeln!(
            out,
            "\t\t\tmax_mtu:\t\t{} ({})",
            p.max_mtu.bytes(),
            p.max_mtu.raw()
        );
        let _ = writeln!(
            out,
            "\t\t\tactive_mtu:\t\t{} ({})",
            p.active_mtu.bytes(),
            p.active_mtu.raw()
        );
        let _ = writeln!(out, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
        let _ = writeln!(out, "\t\t\tport_lid:\t\t{}", p.lid);
        let _ = writeln!(out, "\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
        let _ = writeln!(
            out,
            "\t\t\tlink_layer:\t\t{}",
            link_layer_name(dev, port_num)
        );
        if verbose {
            let _ = writeln!(out, "\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
            let _ = writeln!(
                out,
                "\t\t\tport_cap_flags:\t\t{:#010x}",
                p.port_cap_flags.bits()
            );
            let _ = writeln!(out, "\t\t\tmax_vl_num:\t\t{}", p.max_vl_num);
            let _ = writeln!(out, "\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
            let _ = writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
            let _ = writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
            let (g, t) = hca::rate(p.active_width, p.active_speed);
            let _ = writeln!(out, "\t\t\tactive_width:\t\t{}", width_name(p.active_width));
            let _ = writeln!(out, "\t\t\tactive_speed:\t\t{}", speed_name(p.active_speed));
            let _ = writeln!(
                out,
                "\t\t\tphys_state:\t\t{} ({})",
                devinfo_phys_state(p.phys_state),
                p.phys_state
            );
            let _ = writeln!(out, "\t\t\trate:\t\t\t{g}.{t} Gb/s");
        }
        let _ = writeln!(out);
    }
    Ok(())
}

/// The word ibv_devinfo and ibstat print for a port's link layer.
fn link_layer_name(dev: &Device, port: u8) -> &'static str {
    match dev.port_link_layer(port) {
        Ok(LinkLayer::Ethernet) => "Ethernet",
        _ => "InfiniBand",
    }
}

/// `show_gids [DEV]`, as Mellanox's script prints it: every GID in use
/// with its index, the IPv4 address of an IPv4-mapped GID and the RoCE
/// version (`v1` on an Ethernet port, empty on InfiniBand), then the count.
/// The last column names mlx4_en's interface on an Ethernet port.
pub fn show_gids(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    if args.len() > 1 {
        return Err("usage: show_gids [DEV]".to_string());
    }
    let netdevs = crate::net::en_netdevs();
    let _ = writeln!(out, "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV");
    let _ = writeln!(
        out,
        "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---"
    );
    let mut n = 0;
    for_devices(
        args.first().copied(),
        |d| alloc::format!("no device {d}"),
        |h, dev| {
            for port in 1..=dev.phys_port_cnt() {
                let eth = dev.port_link_layer(port).ok() == Some(LinkLayer::Ethernet);
                let len = dev.gid_tbl_len(port).unwrap_or(0) as usize;
                let ver = if eth { "v1" } else { "" };
                let on_port = || {
                    netdevs
                        .iter()
                        .filter(move |n| Some(n.dev) == h.id && n.port == port)
                };
                // The interface of a GID: the one holding its IPv4 address,
                // the VLAN device its link-local GID names, or the port's.
                let ndev = |g: &[u8; 16]| -> &str {
                    let vid = mlx4_ib::roce::rdma_link_local_addr(g)
                        .then(|| mlx4_ib::roce::rdma_get_vlan_id(g))
                        .filter(|&v| v < 0x1000);
                    let n = match mlx4_ib::roce::gid_ipv4(g) {
                        Some(a) => on_port().find(|n| n.addrs.contains(&a)),
                        None => on_port().find(|n| n.vlan == vid),
                    };
                    n.map_or("", |n| n.name.as_str())
                };
                for i in 0..len {
                    let Ok(g) = dev.get_cached_gid(port, i) else {
                        break;
                    };
                    if g.0 == [0; 16] {
                        continue;
                    }
                    let ip = mlx4_ib::roce::gid_ipv4(&g.0)
                        .map(|a| alloc::format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]))
                        .unwrap_or_default();
                    // Gid's Display: eight groups of four hex digits, as
                    // sysfs and show_gids print it.
                    let nd = if eth { ndev(&g.0) } else { "" };
                    let _ = writeln!(out, "{}\t{port}\t{i}\t{g}\t{ip:<14}\t{ver}\t{nd}", h.name);
                    n += 1;
                }
            }
            Ok(())
        },
    )?;
    let _ = writeln!(out, "n_gids_found={n}");
    Ok(())
}

/// ibv_devinfo's words for a physical port state, which are not ibstat's
/// (`LINK_UP` where ibstat says `LinkUp`; rdma-core keeps the misspelt
/// training state as users grep for it).
fn devinfo_phys_state(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

fn width_name(w: u8) -> &'static str {
    match w {
        1 => "1X (1)",
        2 => "4X (2)",
        4 => "8X (4)",
        8 => "12X (8)",
        _ => "invalid width",
    }
}

fn speed_name(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps (1)",
        2 => "5.0 Gbps (2)",
        4 => "10.0 Gbps (4)",
        8 => "10.0 Gbps (8)",
        16 => "14.0 Gbps (16)",
        32 => "25.0 Gbps (32)",
        _ => "invalid speed",
    }
}

/// `ibv_devices`: every device with its node GUID.
pub fn ibv_devices(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    if !args.is_empty() {
        return Err("usage: ibv_devices".to_string());
    }
    let _ = writeln!(out, "    {:<16}\t   node GUID", "device");
    let _ = writeln!(out, "    {:<16}\t----------------", "------");
    let r = for_devices(
        None,
        |n: &str| String::from(n),
        |h, dev| {
            let _ = writeln!(out, "    {:<16}\t{:016x}", h.name, dev.info().node_guid);
            Ok(())
        },
    );
    match r {
        // No device is an empty list, as rdma-core prints it.
        Err(e) if e == NO_HCA => Ok(()),
        r => r,
    }
}

/// `ibv_devinfo [-v] [-d mlx4_N]`.
pub fn ibv_devinfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let mut verbose = false;
    let mut only: Option<&str> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "-v" => verbose = true,
            "-d" => only = Some(it.next().ok_or("usage: ibv_devinfo [-v] [-d DEVICE]")?),
            _ => return Err("usage: ibv_devinfo [-v] [-d DEVICE]".to_string()),
        }
    }
    for_devices(
        only,
        |n| alloc::format!("no device {n}"),
        |h, dev| devinfo(out, h, dev, verbose),
    )
}

/// `ibstat [CA]`.
pub fn ibstat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    if args.len() > 1 {
        return Err("usage: ibstat [CA_NAME]".to_string());
    }
    for_devices(
        args.first().copied(),
        |n| alloc::format!("CA '{n}' not found"),
        |h, dev| {
            let a = device_attr(h, dev)?;
            let n = dev.phys_port_cnt();
            let _ = writeln!(out, "CA '{}'", h.name);
            let _ = writeln!(out, "\tCA type: MT{}", h.pci.device);
            let _ = writeln!(out, "\tNumber of ports: {n}");
            let _ = writeln!(out, "\tFirmware version: {}", hca::fw_ver(a.fw_ver));
            let _ = writeln!(out, "\tHardware version: {:x}", a.hw_ver);
            let _ = writeln!(out, "\tNode GUID: {:#018x}", dev.info().node_guid);
            let _ = writeln!(out, "\tSystem image GUID: {:#018x}", a.sys_image_guid);
            for port_num in 1..=n {
                let p = port_attr(h, dev, port_num)?;
                let guid = port_guid(h, dev, port_num)?;
                let (g, t) = hca::rate(p.active_width, p.active_speed);
                let _ = writeln!(out, "\tPort {port_num}:");
                let _ = writeln!(out, "\t\tState: {}", hca::ibstat_state(p.state.raw()));
                let _ = writeln!(
                    out,
                    "\t\tPhysical state: {}",
                    hca::phys_state_name(p.phys_state)
                );
                if t == 0 {
                    let _ = writeln!(out, "\t\tRate: {g}");
                } else {
                    let _ = writeln!(out, "\t\tRate: {g}.{t}");
                }
                let _ = writeln!(out, "\t\tBase lid: {}", p.lid);
                let _ = writeln!(out, "\t\tLMC: {}", p.lmc);
                let _ = writeln!(out, "\t\tSM lid: {}", p.sm_lid);
                let _ = writeln!(
                    out,
                    "\t\tCapability mask: {:#010x}",
                    p.port_cap_flags.bits()
                );
                let _ = writeln!(out, "\t\tPort GUID: {guid:#018x}");
                let _ = writeln!(out, "\t\tLink layer: {}", link_layer_name(dev, port_num));
            }
            Ok(())
        },
    )
}

/// `mlx4 caps|catas|bench [N]`: mlx4_core's view, also of a device removed
/// after a catastrophic error.
pub fn mlx4(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let usage = || "usage: mlx4 caps|catas|bench [N]".to_string();
    let (sub, rounds) = match args {
        [s] => (*s, 1000),
        ["bench", n] => (
            "bench",
            n.parse::<u32>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(usage)?,
        ),
        _ => return Err(usage()),
    };
    if !matches!(sub, "caps" | "catas" | "bench") {
        return Err(usage());
    }
    hca::with(|ib| {
        let Ib { core, hcas, .. } = ib;
        if hcas.is_empty() {
            return Err(NO_HCA.to_string());
        }
        for h in hcas.iter_mut() {
            let (name, addr, pci) = (h.name.clone(), h.pci.addr, h.pci);
            let Some(m) = Ib::mlx4(core, h) else {
                continue;
            };
            match sub {
                "caps" => {
                    let _ = writeln!(out, "{name} ({addr}): QUERY_DEV_CAP");
                    let _ = writeln!(out, "{:#?}", m.core().dev_cap());
                }
                "bench" => hca::bench(out, &name, &pci, m, rounds),
                _ => {
                    let dev = m.core_mut();
                    let fw = *dev.fw_info();
                    let bad = dev.poll_catas();
                    let _ = writeln!(
                        out,
                        "{} ({}): internal error buffer at BAR{} + {:#x}, {} dwords: {}",
                        name,
                        addr,
                        fw.catas_bar,
                        fw.catas_offset,
                        fw.catas_size,
                        if bad {
                            "ERROR reported (see dmesg for the dump)"
                        } else {
                            "clear"
                        }
                    );
                }
            }
        }
        Ok(())
    })
    .unwrap_or_else(|| Err(NO_HCA.to_string()))
}

/// `fwtrace on|off`: log every firmware command (mlx4_core::cmd at debug).
pub fn fwtrace(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let spec = match args {
        ["on"] => "mlx4_core::cmd=debug",
        ["off"] => "mlx4_core::cmd=info",
        _ => return Err("usage: fwtrace on|off".to_string()),
    };
    crate::logger::set_filter(spec).map_err(String::from)?;
    let _ = writeln!(
        out,
        "fwtrace: {}",
        if args[0] == "on" {
            "every firmware command is logged"
        } else {
            "off"
        }
    );
    Ok(())
}

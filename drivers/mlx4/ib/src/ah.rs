//! Address handles (Linux `ah.c`: `mlx4_ib_create_ah`, `create_ib_ah`, `mlx4_ib_query_ah`, `mlx4_ib_destroy_ah`).
//!
//! The 32-byte address vector copied into every UD WQE, in its InfiniBand
//! form (`create_ib_ah`) and its Ethernet form (`create_iboe_ah`: the GRH
//! mandatory, the destination MAC and VLAN tag the datagram segment carries
//! after the Q_Key).
//!
//! Linux 3.11 `create_ib_ah` stores the SL word after OR-ing in the traffic
//! class and flow label, wiping them; LegoOS moved the SL first. We keep all
//! three (LegoOS's fix).

use mlx4_core::Caps;
use mlx4_hw::wqe::{Av, av};

use crate::verbs::AhAttr;
use crate::{Error, Result};

/// `IB_RATE_2_5_GBPS`, the lowest `enum ib_rate` the HCA steps down to.
const IB_RATE_2_5_GBPS: u8 = 2;

/// An address handle (Linux `struct mlx4_ib_ah`).
#[derive(Debug, Clone)]
pub struct Mlx4IbAh {
    /// The address vector as it goes on the wire.
    pub(crate) av: [u8; av::SIZE],
    /// What it was created from (`mlx4_ib_query_ah`).
    pub(crate) attr: AhAttr,
    /// The datagram segment's last 8 bytes (`mlx4_eth_av`'s VLAN tag and
    /// destination MAC, as one big-endian word); 0 on InfiniBand.
    pub(crate) vlan_mac: u64,
}

impl Mlx4IbAh {
    /// The address vector bytes.
    pub fn av(&self) -> &[u8; av::SIZE] {
        &self.av
    }
    /// The attributes (Linux `mlx4_ib_query_ah`).
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }
    /// Ethernet: the destination MAC and the VLAN tag (0xffff: none).
    pub fn eth(&self) -> Option<([u8; 6], u16)> {
        if self.vlan_mac == 0 {
            return None;
        }
        let b = self.vlan_mac.to_be_bytes();
        Some((
            [b[2], b[3], b[4], b[5], b[6], b[7]],
            u16::from_be_bytes([b[0], b[1]]),
        ))
    }
}

/// Linux `mlx4_ib_static_rate` as `create_ib_ah` and `mlx4_set_path` do it:
/// the rate plus 5, stepped down until the device supports it.
pub fn static_rate(caps: &Caps, rate: u8) -> u8 {
    if rate == 0 {
        return 0;
    }
    let mut r = rate.saturating_add(av::STAT_RATE_OFFSET);
    while r > IB_RATE_2_5_GBPS + av::STAT_RATE_OFFSET
        && (r >= 16 || caps.stat_rate_support & (1 << r) == 0)
    {
        r -= 1;
    }
    r
}

/// Linux `create_ib_ah`: the address vector of `attr` in protection domain
/// `pdn`.
pub fn create_ib_ah(caps: &Caps, pdn: u32, attr: &AhAttr) -> Result<Mlx4IbAh> {
    if attr.port_num == 0 || attr.port_num > caps.num_ports {
        return Err(Error::Inval("address handle names no port of the HCA"));
    }
    let mut a = Av {
        port_pd: pdn | (u32::from(attr.port_num) << 24),
        g_slid: attr.src_path_bits & 0x7f,
        dlid: attr.dlid,
        stat_rate: static_rate(caps, attr.static_rate),
        sl_tclass_flowlabel: u32::from(attr.sl & 0xf) << 28,
        ..Default::default()
    };
    if let Some(grh) = &attr.grh {
        let gid_len = caps.port[usize::from(attr.port_num)].gid_table_len;
        if u32::from(grh.sgid_index) >= gid_len.max(1) {
            return Err(Error::Inval("source GID index beyond the GID table"));
        }
        a.g_slid |= av::GRH;
        a.gid_index = grh.sgid_index;
        a.hop_limit = grh.hop_limit;
        a.sl_tclass_flowlabel |= (u32::from(grh.traffic_class) << 20) | (grh.flow_label & 0xf_ffff);
        a.dgid = grh.dgid.0;
    }
    Ok(Mlx4IbAh {
        av: a.to_bytes(),
        attr: *attr,
        vlan_mac: 0,
    })
}

/// Linux `create_iboe_ah`: the Ethernet address vector (`mlx4_eth_av`) of
/// `attr` on RoCE port `rp`. An address without a GRH is refused, as Linux
/// refuses it (`-EINVAL`); the destination MAC comes from the DGID
/// ([`crate::roce::RocePort::resolve_dmac`]), the VLAN tag (priority from
/// the SL) from the source GID, the SL also in bits 31:29 of the
/// SL/class/flow word; the source MAC is entry 0 of the MAC table.
pub fn create_iboe_ah(
    caps: &Caps,
    rp: &crate::roce::RocePort,
    pdn: u32,
    attr: &AhAttr,
) -> Result<Mlx4IbAh> {
    let Some(grh) = &attr.grh else {
        return Err(Error::Inval(
            "an address handle on an Ethernet (RoCE) port needs a GRH",
        ));
    };
    if usize::from(grh.sgid_index) >= crate::roce::ROCE_MAX_GIDS {
        return Err(Error::Inval("source GID index beyond the GID table"));
    }
    let mac = rp.resolve_dmac(&grh.dgid.0)?;
    let mut vlan = rp.sgid_vlan_id(grh.sgid_index);
    if vlan < 0x1000 {
        vlan |= u16::from(attr.sl & 7) << 13;
    }
    let a = Av {
        port_pd: pdn | (u32::from(attr.port_num) << 24),
        // mlx4_eth_av: byte 5 is the source MAC index, not the GRH bit.
        g_slid: rp.smac_idx(),
        dlid: 0,
        gid_index: grh.sgid_index,
        stat_rate: static_rate(caps, attr.static_rate),
        hop_limit: grh.hop_limit,
        sl_tclass_flowlabel: (u32::from(attr.sl & 7) << 29)
            | (u32::from(grh.traffic_class) << 20)
            | (grh.flow_label & 0xf_ffff),
        dgid: grh.dgid.0,
    };
    let mut vm = [0u8; 8];
    vm[..2].copy_from_slice(&vlan.to_be_bytes());
    vm[2..].copy_from_slice(&mac);
    Ok(Mlx4IbAh {
        av: a.to_bytes(),
        attr: *attr,
        vlan_mac: u64::from_be_bytes(vm),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{Gid, GlobalRoute};

    fn caps() -> Caps {
        let mut c = Caps {
            num_ports: 2,
            // Rates 2.5 (7), 10 (8), 30 (9)... as a CX-3 reports: bits 7..=12.
            stat_rate_support: 0x1f80,
            ..Default::default()
        };
        c.port[1].gid_table_len = 128;
        c
    }

    #[test]
    fn golden_av_without_and_with_grh() {
        let c = caps();
        let ah = create_ib_ah(
            &c,
            0x21,
            &AhAttr {
                dlid: 0x0005,
                sl: 3,
                src_path_bits: 1,
                port_num: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut g = [0u8; 32];
        g[0..4].copy_from_slice(&[1, 0, 0, 0x21]);
        g[5] = 1;
        g[6..8].copy_from_slice(&[0, 5]);
        g[12] = 0x30;
        assert_eq!(ah.av, g);

        let dgid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0x10, 0xa1, 0xb1,
        ];
        let ah = create_ib_ah(
            &c,
            0x21,
            &AhAttr {
                dlid: 7,
                sl: 2,
                port_num: 1,
                static_rate: 3, // IB_RATE_10_GBPS
                grh: Some(GlobalRoute {
                    dgid: Gid(dgid),
                    flow_label: 0xabcde,
                    sgid_index: 1,
                    hop_limit: 0xff,
                    traffic_class: 0x12,
                }),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(ah.av[5], 0x80, "GRH bit");
        assert_eq!(ah.av[9], 1, "GID index");
        assert_eq!(ah.av[10], 8, "10 Gb/s = 3 + 5");
        assert_eq!(ah.av[11], 0xff);
        // SL, traffic class and flow label all kept (Linux 3.11 lost the
        // latter two).
        assert_eq!(ah.av[12..16], [0x21, 0x2a, 0xbc, 0xde]);
        assert_eq!(ah.av[16..32], dgid);
    }

    #[test]
    fn unsupported_rates_step_down_and_bad_attrs_are_refused() {
        let mut c = caps();
        c.stat_rate_support = 1 << 7; // 2.5 Gb/s only
        assert_eq!(static_rate(&c, 3), 7);
        assert_eq!(static_rate(&c, 0), 0);
        assert_eq!(static_rate(&c, 200), 7, "absurd rates do not overflow");
        let bad_port = AhAttr {
            port_num: 3,
            ..Default::default()
        };
        assert!(matches!(
            create_ib_ah(&c, 1, &bad_port),
            Err(Error::Inval(_))
        ));
        let bad_gid = AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute {
                sgid_index: 200,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(
            create_ib_ah(&c, 1, &bad_gid),
            Err(Error::Inval(_))
        ));
    }
}

//! The flag types print Linux's names (`Display`, and `Debug` around it) exactly as they always have.

use crate::verbs::*;

fn shows<T: core::fmt::Display + core::fmt::Debug>(f: T) -> String {
    format!("{f} / {f:?}")
}

#[test]
fn flag_types_print_their_linux_names() {
    let got = [
        shows(PortCapFlags::empty()),
        shows(PortCapFlags::SM | PortCapFlags::CLIENT_REG_SUP),
        shows(PortCapFlags(0x0251_0868)),
        shows(DeviceCapFlags::RESIZE_MAX_WR | DeviceCapFlags(1 << 31)),
        shows(PortModifyFlags::SHUTDOWN),
        shows(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
        shows(CqNotifyFlags::NEXT_COMP | CqNotifyFlags::REPORT_MISSED_EVENTS),
        shows(WcFlags::GRH | WcFlags::WITH_IMM),
        shows(SendFlags::SIGNALED | SendFlags::INLINE),
        shows(SrqAttrMask(0)),
        shows(QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask(1 << 30)),
        shows(QpAttrMask(u32::MAX)),
    ];
    let want = [
        "0x0 / PortCapFlags(0x0)",
        "IB_PORT_SM|IB_PORT_CLIENT_REG_SUP / PortCapFlags(IB_PORT_SM|IB_PORT_CLIENT_REG_SUP)",
        "IB_PORT_TRAP_SUP|IB_PORT_AUTO_MIGR_SUP|IB_PORT_SL_MAP_SUP|IB_PORT_SYS_IMAGE_GUID_SUP|IB_PORT_CM_SUP|IB_PORT_VENDOR_CLASS_SUP|IB_PORT_CAP_MASK_NOTICE_SUP|IB_PORT_CLIENT_REG_SUP / PortCapFlags(IB_PORT_TRAP_SUP|IB_PORT_AUTO_MIGR_SUP|IB_PORT_SL_MAP_SUP|IB_PORT_SYS_IMAGE_GUID_SUP|IB_PORT_CM_SUP|IB_PORT_VENDOR_CLASS_SUP|IB_PORT_CAP_MASK_NOTICE_SUP|IB_PORT_CLIENT_REG_SUP)",
        "IB_DEVICE_RESIZE_MAX_WR|0x80000000 / DeviceCapFlags(IB_DEVICE_RESIZE_MAX_WR|0x80000000)",
        "IB_PORT_SHUTDOWN / PortModifyFlags(IB_PORT_SHUTDOWN)",
        "IB_ACCESS_LOCAL_WRITE|IB_ACCESS_REMOTE_WRITE|IB_ACCESS_REMOTE_READ / AccessFlags(IB_ACCESS_LOCAL_WRITE|IB_ACCESS_REMOTE_WRITE|IB_ACCESS_REMOTE_READ)",
        "IB_CQ_NEXT_COMP|IB_CQ_REPORT_MISSED_EVENTS / CqNotifyFlags(IB_CQ_NEXT_COMP|IB_CQ_REPORT_MISSED_EVENTS)",
        "IB_WC_GRH|IB_WC_WITH_IMM / WcFlags(IB_WC_GRH|IB_WC_WITH_IMM)",
        "IB_SEND_SIGNALED|IB_SEND_INLINE / SendFlags(IB_SEND_SIGNALED|IB_SEND_INLINE)",
        "0x0 / SrqAttrMask(0x0)",
        "IB_QP_STATE|IB_QP_PKEY_INDEX|0x40000000 / QpAttrMask(IB_QP_STATE|IB_QP_PKEY_INDEX|0x40000000)",
        "IB_QP_STATE|IB_QP_CUR_STATE|IB_QP_EN_SQD_ASYNC_NOTIFY|IB_QP_ACCESS_FLAGS|IB_QP_PKEY_INDEX|IB_QP_PORT|IB_QP_QKEY|IB_QP_AV|IB_QP_PATH_MTU|IB_QP_TIMEOUT|IB_QP_RETRY_CNT|IB_QP_RNR_RETRY|IB_QP_RQ_PSN|IB_QP_MAX_QP_RD_ATOMIC|IB_QP_ALT_PATH|IB_QP_MIN_RNR_TIMER|IB_QP_SQ_PSN|IB_QP_MAX_DEST_RD_ATOMIC|IB_QP_PATH_MIG_STATE|IB_QP_CAP|IB_QP_DEST_QPN|0xffe00000 / QpAttrMask(IB_QP_STATE|IB_QP_CUR_STATE|IB_QP_EN_SQD_ASYNC_NOTIFY|IB_QP_ACCESS_FLAGS|IB_QP_PKEY_INDEX|IB_QP_PORT|IB_QP_QKEY|IB_QP_AV|IB_QP_PATH_MTU|IB_QP_TIMEOUT|IB_QP_RETRY_CNT|IB_QP_RNR_RETRY|IB_QP_RQ_PSN|IB_QP_MAX_QP_RD_ATOMIC|IB_QP_ALT_PATH|IB_QP_MIN_RNR_TIMER|IB_QP_SQ_PSN|IB_QP_MAX_DEST_RD_ATOMIC|IB_QP_PATH_MIG_STATE|IB_QP_CAP|IB_QP_DEST_QPN|0xffe00000)",
    ];
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g, w);
    }
}

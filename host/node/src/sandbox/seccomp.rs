//! The seccomp filters a confined command runs under, compiled once with `seccompiler` into the
//! classic BPF programs `bwrap --add-seccomp-fd` loads.
//!
//! What they refuse (`EPERM`) is what a process inside the sandbox could use to leave it or to
//! reach the kernel's larger attack surface, after the list Flatpak keeps: new namespaces
//! (`unshare`, `setns`, namespace flags to `clone`), mounts of any kind, `pivot_root` and
//! `chroot`, kernel keyrings, `ptrace` and process memory access, `bpf`, `perf_event_open`,
//! `userfaultfd`, module and kexec loading, file handles (`open_by_handle_at` reads any inode of
//! a mount), and typing into the terminal (`ioctl(TIOCSTI)`, `TIOCLINUX`). `clone3` answers
//! `ENOSYS`, so the C library falls back to `clone`, whose flags a filter can see. Calls of
//! another architecture's ABI (i386 on x86-64) kill the process (`seccompiler`'s arch check).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch, sock_filter,
};

/// System calls refused whatever their arguments.
/// (`seccompiler` builds filters for 64-bit machines only, where these are `i64` and `u64`.)
const DENIED: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_personality,
];

/// `clone` flags that make a new namespace.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// `ioctl` requests that act on the terminal as if typed there.
const DENIED_IOCTLS: &[u64] = &[libc::TIOCSTI, libc::TIOCLINUX];

/// Why the filters could not be compiled (an architecture `seccompiler` does not know).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the sandbox's seccomp filter for {arch}: {source}")]
pub struct FilterError {
    arch: &'static str,
    source: seccompiler::BackendError,
}

/// The programs, as the bytes `bwrap` reads: the refusals (`EPERM`), then `clone3` (`ENOSYS`) —
/// two because a filter has one action for what it matches —, then on x86-64 the x32 ABI's
/// calls (numbers from `0x4000_0000`: the same architecture tag, so the first two would let
/// them through), which kill the process.
pub(super) fn programs() -> Result<Vec<Vec<u8>>, FilterError> {
    let arch = std::env::consts::ARCH;
    let fail = |source| FilterError { arch, source };
    let target = TargetArch::try_from(arch).map_err(fail)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|nr| (*nr, vec![])).collect();
    let masked = |arg: u8, len: SeccompCmpArgLen, flag: u64| {
        SeccompCondition::new(arg, len, SeccompCmpOp::MaskedEq(flag), flag).and_then(|c| SeccompRule::new(vec![c]))
    };
    let clone: Result<Vec<SeccompRule>, _> = NAMESPACE_FLAGS
        .iter()
        .map(|flag| masked(0, SeccompCmpArgLen::Qword, *flag as u64))
        .collect();
    rules.insert(libc::SYS_clone, clone.map_err(fail)?);
    let ioctl: Result<Vec<SeccompRule>, _> = DENIED_IOCTLS
        .iter()
        .map(|request| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *request).and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect();
    rules.insert(libc::SYS_ioctl, ioctl.map_err(fail)?);
    let refusals = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), target).map_err(fail)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target,
    )
    .map_err(fail)?;
    let mut programs = vec![bytes(refusals.try_into().map_err(fail)?), bytes(clone3.try_into().map_err(fail)?)];
    if target == TargetArch::x86_64 {
        programs.push(bytes(no_x32()));
    }
    Ok(programs)
}

/// Kills the process at any system call numbered from `__X32_SYSCALL_BIT` (`0x4000_0000`).
fn no_x32() -> BpfProgram {
    // The classic BPF opcodes (`linux/bpf_common.h`): class | size | mode or operation | source.
    const LD_W_ABS: u16 = 0x20; // BPF_LD (0x00) | BPF_W (0x00) | BPF_ABS (0x20)
    const JGE_K: u16 = 0x35; // BPF_JMP (0x05) | BPF_JGE (0x30) | BPF_K (0x00)
    const RET_K: u16 = 0x06; // BPF_RET (0x06) | BPF_K (0x00)
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // The system call's number: `seccomp_data.nr`, at offset 0.
        insn(LD_W_ABS, 0, 0, 0),
        insn(JGE_K, 0, 1, 0x4000_0000),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// A program as the kernel's `struct sock_filter` array, in native byte order.
fn bytes(program: BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for insn in program {
        out.extend_from_slice(&insn.code.to_ne_bytes());
        out.push(insn.jt);
        out.push(insn.jf);
        out.extend_from_slice(&insn.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_compile_for_this_machine() {
        let programs = programs().unwrap();
        assert!(programs.iter().all(|p| !p.is_empty() && p.len() % 8 == 0));
        assert!(programs[0].len() > programs[1].len());
        assert_eq!(programs.len(), if cfg!(target_arch = "x86_64") { 3 } else { 2 });
    }
}

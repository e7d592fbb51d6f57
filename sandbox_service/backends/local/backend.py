"""LocalBackend: each sandbox is a process tree in fresh Linux namespaces on this machine.

What the isolation covers (runtime "namespaces", the default; runtime "gvisor" in local/gvisor.py)
- Namespaces: mount, pid, net, uts, ipc, set up by the agent itself (a pre-forked zygote, agent/boot.py),
  then a *user namespace* entered last: uid/gid 0..65535 in the sandbox are unprivileged host ids of a
  range of its own (slot n of a machine-wide pool: userns_base + n * 65536.., returned on delete; the
  namespace is created as that uid too), so per-user kernel counters (inotify instances, message queue
  bytes, RLIMIT_NPROC) and its delegated cgroup never span sandboxes. Every other namespace stays owned
  by the host's user namespace, so root inside holds no capability over its own mounts, network or
  hostname, and on the host it owns nothing but the sandbox's files (nor the host root's kernel
  keyring). The lower layer (skeleton or image, owned by host root on disk) is an idmapped mount
  through the sandbox's namespace, so its root owns it whatever its range; snapshots are saved owned from
  id 0 and mounted the same way, read-only, beneath a fork's or a restore's empty upper layer (nothing is
  copied; local/snapshots.py). The agent is PID 1; killing it ends every process of the sandbox.
- Filesystem: a root from an allowlist, not the host minus masks (local/root.py): the overlay's lower
  layer is an image directory, or a skeleton with a sanitised /etc (world-readable files only: no
  shadow, gshadow, ssh host keys) and read-only binds of /usr, /lib*, /bin, /sbin, Playwright's browsers,
  the service's venv and its base interpreter (`root_allowlist`, `extra_ro_binds`). No home
  directories, project checkout, /var, /srv, /mnt, /opt, state dir (other sandboxes' layers, snapshots,
  task data) are in view. The upper layer lives on a tmpfs of `disk_mb` with an inode limit, so a full
  disk is ENOSPC inside. Fresh /proc (kernel knobs read-only, kcore/keys masked), minimal /dev,
  read-only /sys, private tmpfs /tmp and /run.
- Seccomp (agent/seccomp.py, libseccomp): keyrings, bpf, perf_event_open, io_uring, userfaultfd,
  fanotify, module/kexec loading, the mount family, setns and unshare/clone of new namespaces fail with
  EPERM, io_setup with ENOSYS (AIO contexts are one machine-wide pool), modelled on Docker's default
  profile; it covers the agent after its boot and every command.
- Resources: cgroup memory (+memsw, and on cgroup v1 a TCP buffer limit: socket buffers are otherwise
  charged to no cgroup and come out of the machine's net.ipv4.tcp_mem), cpu quota and pids limits
  (`local/cgroups.py`); at most `pty_max` ptys (its devpts `max=`). Machine-wide kernel pools one sandbox
  could drain are listed in docs/concepts/threat-model.md; the ceilings of those that need it are raised
  at start (`local/ceilings.py`). The agent runs
  at oom_score_adj -1000, so a workload OOM kills the workload, is counted in memory.oom_control and
  is reported as OOM_KILLED (exec result and `status()`); a fork bomb hits pids.max, not the agent.
- Network: none (no interface up, not even lo) by default, loopback, or an allowlist enforced on the
  host end of the sandbox's link by nftables (`local/network.py`, `local/egress.py`), changeable live.
- Privilege: commands and the agent (after its boot) hold only the bounding set, without CAP_SYS_ADMIN,
  NET_ADMIN, SYS_PTRACE, SYS_MODULE, MKNOD, DAC_READ_SEARCH and other dangerous capabilities, and those
  only inside the user namespace; the agent is non-dumpable (commands cannot reach its fds).

What it does not cover
- It is not a VM: the sandbox shares the host kernel, whose whole remaining system-call surface (after
  seccomp) is reachable; a kernel exploit there escapes. runtime="gvisor" puts gVisor's user-space
  kernel in between (slower, fewer features); for untrusted code from the internet use the Kubernetes
  backend with a VM runtime class (Kata) or gVisor. No LSM (AppArmor/SELinux) profile.
- The writable layer, /tmp, /run and /dev/shm are one tmpfs whose pages count against the memory
  cgroup: it is capped at memory_mb minus memory_headroom_mb (disk_size_mb), so disk_mb above that is
  not granted; filling it is ENOSPC for the command that did it.
- The agent keeps fds of its cgroup directories (per-exec groups and kills, agent/proctree.py): from one,
  `..` names the other sandboxes' groups. Commands cannot use them (PID 1 is non-dumpable and imports
  nothing a sandbox wrote, agent/boot.py confine_imports), and every sandbox's delegated groups belong
  to its own uid, so none can be written from another sandbox.
- An image whose filesystem cannot be idmapped (or with files owned by ids outside 0..65535 on disk) is
  seen as owned by nobody: readable, not writable by the sandbox's root except /workspace, /root, /tmp.
- Allowlist mode cannot reach the internet without host IP forwarding and a network that routes the
  sandbox subnet back (no NAT is configured, and sandbox traffic is untracked); it reaches addresses on
  this host (each named one by one) and such networks. veth names/addresses and the egress table are
  machine-wide (`net_index_dir`, nftables table `inet orchard_egress`).
- The agent cannot lower its own oom_score_adj where the service lacks CAP_SYS_RESOURCE (this VM);
  it then raises every command's score to +1000 instead, which has the same effect in practice.
- cgroup v2 is implemented but only v1 is exercised on this machine; per-exec tracking on v2 moves a
  command into its exec cgroup right after spawn (a tiny window in which a fork could escape).
- With isolation="none" (operator's explicit choice, e.g. ORCHARD_UNISOLATED=1) there is no
  isolation at all: the agent is a plain subprocess confined only in its file API to a workspace
  directory; `status().message` and the agent's ping say "unisolated".

Use

    backend = LocalBackend(LocalBackendConfig(state_dir="/var/lib/orchard"))   # or LocalBackend.from_env()
    endpoint = backend.start(sandbox_id, spec, spec.resources, secret)        # blocks ~50-100 ms
    client = AgentClient(endpoint)                                            # agent/client.py
    backend.apply_network_policy(sandbox_id, NetworkPolicy(mode="loopback"))
    size = backend.snapshot(sandbox_id, "snap-1"); backend.restore(sandbox_id, "snap-1")
    backend.start(other_id, SandboxCreate(from_snapshot="snap-1"), res, secret2)    # fork
    backend.stop(sandbox_id)          # idempotent; frees processes, mounts, cgroups, veth, dirs
    for orphan in backend.list_orphans(): backend.stop(orphan)    # after a service crash

All methods are blocking and thread-safe (the service calls them from worker threads). start() returns
once the agent listens (it reports its ready line), so the service's first ping succeeds at once.

How a sandbox starts (see agent/boot.py for the mounts): the backend creates the cgroups and the
sandbox dir, writes boot.json, then a pre-imported agent *zygote* (agent/zygote.py, one per state dir,
started on first use, stopped by close()) forks a child that unshares the namespaces and becomes the
sandbox's PID 1; with `fast_start=False` the same happens through `unshare ... python -m
sandbox_service.agent --boot boot.json` instead. The agent binds its Unix socket at a host path before
pivoting into the sandbox root, so the sandbox cannot reach the socket, the secret or boot.json.

Paths: file ops are confined to /workspace. `SandboxCreate.workdir` (default /workspace, created if
missing) is the default cwd and the base of relative paths; a workdir outside /workspace is allowed
for commands, but file ops there are refused. Restores restart the agent at the same socket: keep using
the same AgentClient (it replaces stale pooled connections). Cleanup checks can use
`backend.cgroup_parent` (cgroup dir name per controller) and `backend.state_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sandbox_service.agent import boot
from sandbox_service.backends.local import ceilings as local_ceilings
from sandbox_service.backends.local import gvisor as local_gvisor
from sandbox_service.backends.local import network as local_network
from sandbox_service.backends.base import AgentEndpoint, BackendStatus, SandboxBackend
from sandbox_service.backends.fstree import remove_tree
from sandbox_service.backends.local.cgroups import SandboxCgroups, detect_version
from sandbox_service.backends.local.config import DEFAULT_PATH, LocalBackendConfig, check_isolation
from sandbox_service.backends.local.root import build_root, service_python_dir
from sandbox_service.backends.local.rootfs import SandboxDir, SandboxRecord, copy_tree, install_agent
from sandbox_service.backends.local.snapshots import SnapshotStore
from sandbox_service.backends.local.slots import MachineSlots
from sandbox_service.backends.local.zygote import Zygote
from sandbox_service.errors import BackendUnavailableError, InvalidRequestError, SandboxNotFoundError
from sandbox_service.models import InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

__all__ = ["LocalBackend", "LocalBackendConfig"]

# A name in the image directory (registry-style "a/b:tag" allowed), never a host path: no leading "/", ".",
# "~", no "." or ".." component.
IMAGE_NAME = re.compile(r"(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9][A-Za-z0-9._:@/-]{0,254}(?<!/)")


class LocalBackend(SandboxBackend):
    name = "local"

    def __init__(self, config: LocalBackendConfig | None = None, *, isolation: str | None = None):
        config = config or LocalBackendConfig.from_env()
        if isolation is not None:
            config = config.model_copy(update={"isolation": isolation})
        self.config = config
        self.isolated = config.isolation == "namespaces"
        if self.isolated:
            check_isolation()
            self._cg_version = detect_version()
            if config.raise_kernel_ceilings:
                local_ceilings.raise_ceilings(config.userns_pool_size, config.pty_max)
        self.state_dir = Path(config.state_dir).resolve()
        self.cgroup_parent = config.cgroup_parent or (
            "orchard-" + hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:10]
        )
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.state_dir / "s").mkdir(exist_ok=True)
        self.agent_dir = install_agent(self.state_dir)
        self.snapshots = SnapshotStore(self.state_dir, config.snapshot_max_layers)
        self.image_dir = Path(config.image_dir or self.state_dir / "images").resolve()
        self.root_lower: Path | None = None
        self.root_binds: list[str] = []
        if self.isolated:
            allowlist = list(config.root_allowlist)
            if config.prepend_service_python_to_path:  # the venv and the interpreter it links to
                allowlist += [sys.prefix, sys.base_prefix]
            self.root_lower, self.root_binds = build_root(self.state_dir, allowlist)
        self.python = config.agent_python or os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        self._lock = threading.Lock()
        self._launchers: dict[str, subprocess.Popen] = {}
        self._records: dict[str, SandboxRecord] = {}
        # The agent's command line (/proc/1/cmdline in a sandbox) names no host path: the agent dir, the
        # zygote socket and the unshare path's arguments travel in the environment, which the agent
        # (non-dumpable) does not show and clears before serving.
        self._launch_code = (
            "import os, sys; sys.path.insert(0, os.environ.pop('ORCHARD_AGENT_DIR')); "
            "from sandbox_service.agent.__main__ import main; sys.exit(main())"
        )
        self._launch_env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "ORCHARD_AGENT_DIR": str(self.agent_dir)}
        self._zygote = None
        self._gvisor = None
        if self.isolated and config.runtime == "gvisor":
            self._gvisor = local_gvisor.GvisorRuntime(config.gvisor_platform)
        elif self.isolated and config.fast_start:
            self._zygote = Zygote(
                self.python,
                self._launch_code,
                self.state_dir / "zygote.sock",
                self.state_dir / "zygote.log",
                self._launch_env,
            )
        self.net_indexes = MachineSlots(config.net_index_dir, 65000, "allowlist network slots")
        if self.isolated and self._gvisor is None:
            local_network.remove_stale_filters(self.net_indexes)
        self.uid_slots = None
        if self.isolated and config.userns and self._gvisor is None:
            self.uid_slots = MachineSlots(config.userns_slot_dir, config.userns_pool_size, "sandbox id ranges")

    @classmethod
    def from_env(cls) -> "LocalBackend":
        return cls(LocalBackendConfig.from_env())

    # -- helpers -------------------------------------------------------------------------------
    def _dir(self, sandbox_id: str) -> SandboxDir:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise InvalidRequestError(f"invalid sandbox id {sandbox_id!r}")
        return SandboxDir(self.state_dir, sandbox_id)

    def _cgroups(self, sandbox_id: str) -> SandboxCgroups:
        return SandboxCgroups(sandbox_id, self.cgroup_parent, version=self._cg_version)

    def cgroups(self, sandbox_id: str) -> SandboxCgroups | None:
        """The sandbox's cgroups (None when unisolated); for status pages and tests."""
        return self._cgroups(sandbox_id) if self.isolated else None

    def record(self, sandbox_id: str) -> SandboxRecord:
        rec = self._records.get(sandbox_id) or self._dir(sandbox_id).load()
        if rec is None:
            raise SandboxNotFoundError(f"local backend holds no sandbox {sandbox_id!r}")
        return rec

    def _apply_network(self, d: SandboxDir, rec: SandboxRecord, policy: NetworkPolicy) -> None:
        if policy.mode == "allowlist" and rec.net_index is None:
            rec.net_index = self.net_indexes.acquire(str(d.root))
            d.save(rec)
        if rec.host_pid is None:  # what nsenter would refuse: no namespace to enter
            raise BackendUnavailableError(f"network setup failed: sandbox {rec.id} has no running agent")
        if rec.net_index is None:  # never had a veth: only lo to switch
            local_network.set_loopback(rec.host_pid, policy.mode != "none")
        else:
            local_network.apply(rec.host_pid, rec.net_index, self.config.allowlist_subnet, policy)

    def _base_env(self, image: str | None, env: dict[str, str]) -> dict[str, str]:
        path = DEFAULT_PATH
        if image is None and self.config.prepend_service_python_to_path:
            path = f"{service_python_dir()}:{path}"
        return {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8", **env}

    def _ro_binds(self, image: str | None) -> list[str]:
        binds = self.root_binds if image is None else []
        return [*binds, *(b for b in self.config.extra_ro_binds if b not in binds)]

    def _uid_base(self, rec: SandboxRecord) -> int | None:
        """The first host uid of the sandbox's own id range (its root), None without a user namespace."""
        if rec.uid_slot is None:
            return None
        return self.config.userns_base + rec.uid_slot * self.config.userns_size

    def _userns(self, rec: SandboxRecord) -> dict | None:
        base = self._uid_base(rec)
        return {"base": base, "size": self.config.userns_size} if base is not None else None

    def _use_snapshot(self, snapshot_id: str, d: SandboxDir, rec: SandboxRecord) -> None:
        """Start `rec` from the snapshot: isolated, its layers are mounted beneath an empty upper (pinned
        until stop or the next restore); unisolated, its one layer is copied into the workspace."""
        if self.isolated:
            rec.layers = self.snapshots.pin(snapshot_id)
            d.save(rec)
        else:
            (layer,) = self.snapshots.meta(snapshot_id)["layers"]
            copy_tree(self.snapshots.layer(layer), d.workspace)

    def _mount_disk(self, d: SandboxDir, resources: Resources) -> None:
        """The writable layer lives on a tmpfs of disk_mb (and disk_mb * disk_inodes_per_mb inodes), so a
        sandbox that fills it gets ENOSPC and the state dir's filesystem is untouched. Its pages are charged
        to the memory cgroup of the process writing them (the sandbox's), like its /tmp."""
        size = self.disk_size_mb(resources)
        inodes = size * self.config.disk_inodes_per_mb
        boot.mount(
            "tmpfs", str(d.disk), "tmpfs", boot.MS_NOSUID | boot.MS_NODEV, f"size={size}m,nr_inodes={inodes},mode=700"
        )

    def disk_size_mb(self, resources: Resources) -> int:
        """The disk tmpfs holds everything memory-backed a sandbox writes (upper layer, /tmp, /run,
        /dev/shm) and its pages count against memory_mb, so it is disk_mb but at most memory_mb minus
        `memory_headroom_mb` (half of memory_mb when that is smaller): whoever fills it gets ENOSPC, and
        the agent and later commands keep memory to run in."""
        headroom = min(self.config.memory_headroom_mb, resources.memory_mb // 2)
        return max(1, min(resources.disk_mb, resources.memory_mb - headroom))

    @staticmethod
    def _umount_disk(d: SandboxDir) -> None:
        if os.path.ismount(d.disk):
            boot.umount(str(d.disk))

    def check_image(self, image: str) -> None:
        if not IMAGE_NAME.fullmatch(image) or "//" in image:
            raise InvalidRequestError(
                f"image {image!r} is not an image name: the local backend runs the built roots of its image "
                f"directory ({self.image_dir}) by name, e.g. image='bookworm' for "
                "scripts/build-debian-root.sh <image_dir>/bookworm; host paths are refused"
            )
        if not self.isolated:
            raise InvalidRequestError("images need isolation; unisolated mode runs on the host root")

    def knows_image(self, image: str) -> bool:
        return bool(IMAGE_NAME.fullmatch(image)) and self._built_root(image) is not None

    def _built_root(self, image: str) -> Path | None:
        """<image_dir>/<image> if it is a directory really inside the image directory (no symlink out)."""
        root = (self.image_dir / image).resolve()
        return root if root.is_dir() and root.is_relative_to(self.image_dir) else None

    def _image_root(self, image: str) -> str:
        """The built root of image `image` (a name, checked), for the overlay's lower layer."""
        self.check_image(image)
        root = self._built_root(image)
        if root is None:
            raise InvalidRequestError(f"no image {image!r} in {self.image_dir} (build it there first)")
        return str(root)

    # -- SandboxBackend ------------------------------------------------------------------------
    def start(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str) -> AgentEndpoint:
        image = spec.image
        if spec.from_snapshot:
            meta = self.snapshots.meta(spec.from_snapshot)
            if image is not None and image != meta.get("image"):
                raise InvalidRequestError(
                    f"snapshot {spec.from_snapshot!r} was taken on image {meta.get('image')!r}, "
                    f"not {image!r}; omit image to fork it"
                )
            image = meta.get("image")
        if image is not None:
            self._image_root(image)
        d = self._dir(sandbox_id)
        if d.root.exists():
            raise InvalidRequestError(f"sandbox {sandbox_id!r} already exists in {d.root}")
        rec = SandboxRecord(
            id=sandbox_id,
            image=image,
            workdir=spec.workdir,
            env=dict(spec.env),
            resources=resources,
            network=spec.network,
            isolation="namespaces" if self.isolated else "none",
            service_pid=os.getpid(),
        )
        try:
            d.create(secret)
            if self.uid_slots is not None:
                rec.uid_slot = self.uid_slots.acquire(str(d.root))
            d.save(rec)
            with self._lock:
                self._records[sandbox_id] = rec
            if self.isolated:
                self._mount_disk(d, resources)
            d.make_layers()
            if spec.from_snapshot:
                self._use_snapshot(spec.from_snapshot, d, rec)
            if self.isolated:
                cg = self._cgroups(sandbox_id)
                cg.create(resources)
                uid_base = self._uid_base(rec)  # None exactly when the sandbox has no uid slot
                if uid_base is not None:
                    cg.delegate(uid_base)
            self._launch(d, rec)
            if self.isolated and rec.network.mode == "allowlist":
                if self._gvisor is not None:
                    raise local_gvisor.refuse("allowlist networking")
                self._apply_network(d, rec, rec.network)
        except BaseException:
            self.stop(sandbox_id)
            raise
        address = self._gvisor_socket(d) if self._gvisor is not None else d.socket
        return AgentEndpoint(transport="unix", address=str(address), secret=secret)

    def _launch(self, d: SandboxDir, rec: SandboxRecord) -> None:
        base_env = self._base_env(rec.image, rec.env)
        ready_r, ready_w = os.pipe()
        if self._gvisor is not None:
            os.close(ready_r)
            os.close(ready_w)
            self._launch_gvisor(self._gvisor, d, rec, base_env)
            return
        if self.isolated:
            cg = self._cgroups(rec.id)
            config = {
                "lower": self._image_root(rec.image) if rec.image else str(self.root_lower),
                "upper": str(d.upper),
                "work": str(d.work),
                "merged": str(d.merged),
                "agent_dir": str(self.agent_dir),
                "masks": [*self.config.mask_paths, str(self.state_dir)],
                "ro_binds": self._ro_binds(rec.image),
                "seccomp": self.config.seccomp,
                "userns": self._userns(rec),
                "lower_idmapped": str(d.root / "lower"),
                "layers": [
                    {"path": str(self.snapshots.layer(layer)), "idmapped": str(d.root / f"l{i}")}
                    for i, layer in enumerate(rec.layers)
                ],
                "cgroup_procs": cg.procs_files(),
                "pids_cgroup": str(cg.work_pids_dir),
                "oom_counter": str(cg.oom_counter),
                "hostname": f"sbx-{rec.id[:20]}",
                "lo_up": rec.network.mode != "none",
                "pty_max": self.config.pty_max,
                "scratch": str(d.scratch),
                "workspace": "/workspace",
                "workdir": rec.workdir,
                "env": base_env,
            }
            d.boot.write_text(json.dumps(config))
            agent_args = [
                "--unix",
                str(d.socket),
                "--secret-file",
                str(d.secret),
                "--workspace",
                "/workspace",
                "--workdir",
                rec.workdir,
                "--boot",
                str(d.boot),
            ]
            if self._zygote is not None:
                os.close(ready_r)
                os.close(ready_w)
                status = self._zygote.spawn(agent_args, d.log, self.config.boot_timeout_seconds, self._uid_base(rec))
                if not status.get("ok"):
                    raise BackendUnavailableError(f"sandbox boot failed: {status.get('message')}; log: {_tail(d.log)}")
                rec.launcher_pid = None
                rec.host_pid = status["host_pid"]
                d.save(rec)
                return
            argv = [
                "unshare",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                self.python,
                "-I",
                "-S",
                "-c",
                self._launch_code,
            ]
            env = {**self._launch_env, "ORCHARD_AGENT_ARGV": json.dumps([*agent_args, "--ready-fd", str(ready_w)])}
        else:
            d.workspace.mkdir(exist_ok=True)
            argv = [
                self.python,
                "-I",
                "-S",
                "-c",
                self._launch_code,
                "--unix",
                str(d.socket),
                "--secret-file",
                str(d.secret),
                "--workspace",
                str(d.workspace),
                "--workspace-alias",
                "/workspace",
                "--workdir",
                rec.workdir,
                "--ready-fd",
                str(ready_w),
                "--isolation",
                "unisolated",
                *[f"--env={k}={v}" for k, v in base_env.items()],
            ]
            env = self._launch_env
        try:
            with open(d.log, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(ready_w,),
                    env=env,
                    start_new_session=True,
                    cwd=str(d.root),
                )
        finally:
            os.close(ready_w)
        with self._lock:
            self._launchers[rec.id] = proc
        rec.launcher_pid = proc.pid
        try:
            status = self._read_ready(ready_r, d)
        finally:
            os.close(ready_r)
        rec.host_pid = status.get("host_pid", proc.pid)
        d.save(rec)

    def _gvisor_socket(self, d: SandboxDir) -> Path:
        return d.root / "gsock" / "a.sock"

    def _launch_gvisor(
        self, gvisor: local_gvisor.GvisorRuntime, d: SandboxDir, rec: SandboxRecord, base_env: dict[str, str]
    ) -> None:
        if rec.image is None:
            python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        elif os.path.exists(os.path.join(self._image_root(rec.image), "usr/bin/python3")):
            python = "/usr/bin/python3"  # the agent is stdlib-only: the image's interpreter runs it
        else:
            raise InvalidRequestError(
                f"image {rec.image!r} has no /usr/bin/python3, which runtime 'gvisor' needs to run the agent inside it"
            )
        sock = self._gvisor_socket(d)
        sock.parent.mkdir(exist_ok=True)
        args = [
            "--unix",
            f"{local_gvisor.IN_SANDBOX_SOCKET_DIR}/{sock.name}",
            "--secret-file",
            local_gvisor.IN_SANDBOX_SECRET,
            "--workspace",
            "/workspace",
            "--workdir",
            rec.workdir,
            "--isolation",
            "gvisor",
            *[f"--env={k}={v}" for k, v in base_env.items()],
        ]
        oci = local_gvisor.spec(
            lower=self._image_root(rec.image) if rec.image else str(self.root_lower),
            binds=self._ro_binds(rec.image),
            agent_dir=str(self.agent_dir),
            socket_dir=str(sock.parent),
            secret=str(d.secret),
            python=python,
            agent_args=args,
            hostname=f"sbx-{rec.id[:20]}",
            pids=rec.resources.pids,
        )
        cg = self._cgroups(rec.id)
        procs = [p for p in cg.procs_files() if "/pids/" not in p]  # Sentry threads would eat pids.max
        proc = gvisor.launch(
            root=d.root,
            container_id=f"orchard-{rec.id}",
            oci=oci,
            cgroup_procs=procs,
            log=d.log,
            socket_path=sock,
            timeout=self.config.boot_timeout_seconds,
        )
        with self._lock:
            self._launchers[rec.id] = proc
        rec.launcher_pid = rec.host_pid = proc.pid
        d.save(rec)

    def _read_ready(self, fd: int, d: SandboxDir) -> dict:
        deadline = time.monotonic() + self.config.boot_timeout_seconds
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise BackendUnavailableError(
                    f"sandbox agent did not come up within {self.config.boot_timeout_seconds:g} s; log: {_tail(d.log)}"
                )
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        try:
            status = json.loads(buf)
        except ValueError:
            raise BackendUnavailableError(f"sandbox agent exited during boot; log: {_tail(d.log)}") from None
        if not status.get("ok"):
            raise BackendUnavailableError(f"sandbox boot failed: {status.get('message')}; log: {_tail(d.log)}")
        return status

    def status(self, sandbox_id: str) -> BackendStatus:
        rec = self.record(sandbox_id)
        proc = self._launchers.get(sandbox_id)
        alive = rec.host_pid is not None and _pid_alive(rec.host_pid)
        if proc is not None and proc.poll() is not None:
            alive = False
        note = "unisolated (no namespaces, no cgroups)" if not self.isolated else None
        oom = self._cgroups(sandbox_id).oom_kills() if self.isolated else 0
        if not alive:
            kind = InfraErrorKind.OOM_KILLED if oom else InfraErrorKind.SANDBOX_CRASHED
            return BackendStatus(
                alive=False,
                infra_error=kind,
                message=f"sandbox agent (pid {rec.host_pid}) is gone; log: {_tail(self._dir(sandbox_id).log)}",
            )
        if oom:
            return BackendStatus(
                alive=True,
                infra_error=InfraErrorKind.OOM_KILLED,
                message=f"{oom} process(es) were OOM-killed at the {rec.resources.memory_mb} MiB memory limit",
            )
        return BackendStatus(alive=True, message=note)

    def status_after_agent_loss(self, sandbox_id: str, settle_seconds: float = 2.0) -> BackendStatus:
        """The agent's socket closes while its process is still exiting (files are closed before the
        process turns zombie, and a PID 1 takes its whole pid namespace down first): wait up to
        `settle_seconds` for the death to show, so a killed sandbox is not taken for a live one."""
        deadline = time.monotonic() + settle_seconds
        status = self.status(sandbox_id)
        while status.alive and time.monotonic() < deadline:
            time.sleep(0.02)
            status = self.status(sandbox_id)
        return status

    def _kill(self, sandbox_id: str, rec: SandboxRecord | None) -> None:
        """Kill every process of the sandbox and reap the launcher (mounts die with the mount namespace)."""
        if self.isolated:
            cg = self._cgroups(sandbox_id)
            if self._gvisor is None and rec is not None and rec.host_pid:
                _end_pid_namespace(cg, rec.host_pid)
            cg.kill_all()  # whatever is left (nothing, as a rule): frozen and killed until the group is empty
        for pid in (rec.host_pid, rec.launcher_pid) if rec else ():
            if pid and _pid_alive(pid):
                try:
                    if self.isolated:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if self._gvisor is not None:
            self._gvisor.delete(self._dir(sandbox_id).root, f"orchard-{sandbox_id}")
        with self._lock:
            proc = self._launchers.pop(sandbox_id, None)
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop(self, sandbox_id: str) -> None:
        d = self._dir(sandbox_id)
        rec = self._records.get(sandbox_id) or d.load()
        self._kill(sandbox_id, rec)
        if self.isolated:
            self._umount_disk(d)
            if rec is not None and rec.net_index is not None:
                local_network.remove_link(rec.net_index)
                self.net_indexes.release(rec.net_index, str(d.root))
            self._cgroups(sandbox_id).remove()
        if rec is not None and rec.uid_slot is not None and self.uid_slots is not None:
            self.uid_slots.release(rec.uid_slot, str(d.root))
        d.remove()
        with self._lock:
            known = self._records.pop(sandbox_id, None)
        if known is not None:  # only this instance pinned its layers, and only once
            self.snapshots.unpin(known.layers)

    def apply_network_policy(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        rec = self.record(sandbox_id)
        if not self.isolated:
            if policy.mode != "loopback" and policy != rec.network:
                raise InvalidRequestError("unisolated sandboxes share the host network; no policy can be enforced")
        elif self._gvisor is not None:
            if policy.mode == "allowlist":
                raise local_gvisor.refuse("allowlist networking")
        else:
            self._apply_network(self._dir(sandbox_id), rec, policy)
        rec.network = policy
        self._dir(sandbox_id).save(rec)

    def snapshot(self, sandbox_id: str, snapshot_id: str) -> int:
        if self._gvisor is not None:
            raise local_gvisor.refuse("snapshot")
        rec = self.record(sandbox_id)
        d = self._dir(sandbox_id)
        meta = {"image": rec.image, "workdir": rec.workdir, "sandbox_id": sandbox_id}
        if not self.isolated:
            return self.snapshots.save(snapshot_id, d.workspace, meta, beneath=[], owners=None, id_range=0)
        cg = self._cgroups(sandbox_id)
        cg.freeze(True)  # a consistent upper layer: nothing writes while it is copied
        try:
            return self.snapshots.save(
                snapshot_id,
                d.upper,
                meta,
                beneath=rec.layers,
                owners=self._uid_base(rec),
                id_range=self.config.userns_size,
            )
        finally:
            cg.freeze(False)

    def restore(self, sandbox_id: str, snapshot_id: str) -> None:
        rec = self.record(sandbox_id)
        if rec.image != self.snapshots.meta(snapshot_id).get("image"):
            raise InvalidRequestError(
                f"snapshot {snapshot_id!r} was taken on another image than sandbox {sandbox_id!r}"
            )
        d = self._dir(sandbox_id)
        self._kill(sandbox_id, rec)
        target = d.upper if self.isolated else d.workspace
        remove_tree(target)
        target.mkdir()
        before = rec.layers
        self._use_snapshot(snapshot_id, d, rec)
        self.snapshots.unpin(before)
        d.reset_layers()
        self._launch(d, rec)
        if self.isolated and rec.network.mode == "allowlist":
            self._apply_network(d, rec, rec.network)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.delete(snapshot_id)

    def clear_stale_snapshots(self) -> list[str]:
        return self.snapshots.clear()

    def list_orphans(self) -> list[str]:
        """Sandboxes on disk (or, after a lost state dir, in our cgroups) that this instance did not start."""
        with self._lock:
            known = set(self._records)
        found = {child.name for child in (self.state_dir / "s").iterdir()}
        if self.isolated:
            for controller_dir in {d.parent for d in self._cgroups("_").dirs.values()}:
                if controller_dir.is_dir():
                    found.update(c.name for c in controller_dir.iterdir() if c.is_dir())
        return sorted(found - known)

    def close(self) -> None:
        """Stop the agent zygote and remove the (empty) cgroup parent directories and, when no allowlist
        sandbox is left on the machine, the egress table; sandboxes themselves are stopped by the service
        and leftovers of a crash are found by list_orphans()."""
        if self._zygote is not None:
            self._zygote.close()
        if not self.isolated:
            return
        if self._gvisor is None:
            local_network.release_table(self.net_indexes)
        for controller_dir in {d.parent for d in self._cgroups("_").dirs.values()}:
            try:
                controller_dir.rmdir()
            except OSError:  # sandboxes still running (or already gone): leave it
                pass


def _end_pid_namespace(cg: SandboxCgroups, agent_pid: int, wait: float = 2.0) -> None:
    """SIGKILL the agent, PID 1 of the sandbox's pid namespace (through a pidfd taken before checking that
    the pid is in the sandbox's cgroup, so a reused pid is never hit): the kernel then kills every other
    process of the namespace and refuses new forks in it, so the group empties without a freeze. Waits up
    to `wait` seconds for the agent's exit, which the kernel reports only once the namespace's other
    processes are gone (polling the cgroup every millisecond instead was 8 % of the service's Python time
    at 1,000 sandboxes on a loaded machine). The wait costs no CPU, so it is long: at load 40-80 the
    namespace's end took 120 ms at the median and over 200 ms for one delete in five, which a 0.2 s wait
    handed to the freeze-kill-thaw loop of `kill_all` (10 % of the service's Python time there)."""
    try:
        pidfd = os.pidfd_open(agent_pid)
    except OSError:  # gone already
        return
    try:
        if agent_pid not in cg.pids():
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        exited = select.poll()
        exited.register(pidfd, select.POLLIN)
        exited.poll(wait * 1000)
    finally:
        os.close(pidfd)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _tail(path: Path, n: int = 800) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace").strip() or "(empty)"
    except OSError:
        return "(no log)"

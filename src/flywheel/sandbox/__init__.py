"""flywheel.sandbox: Linux plumbing only — bubblewrap and local sandboxes (sandbox.py), host facts (host.py),
copy-on-write workspaces (workspace.py), the read-only root and exec helper (rootfs.py), network namespaces
(netns.py) and exec without a shell (direct_exec.py). Nothing here knows about tasks or grading."""

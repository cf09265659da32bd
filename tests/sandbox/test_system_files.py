"""The sandbox's prepared /etc: copies of what programs need, and mount points for more."""

from __future__ import annotations

import os
import stat

from envhub.sandbox.system_files import COPIED, prepared_etc


def test_copies_and_mount_points() -> None:
    folder = prepared_etc(["/etc/hosts", "/etc/no-such-file", "/opt/elsewhere"])
    names = sorted(os.listdir(folder))
    copied = [os.path.basename(p) for p in COPIED if os.path.lexists(p)]
    assert names == sorted([*copied, "hosts"])
    assert os.path.getsize(os.path.join(folder, "hosts")) == 0  # an empty mount point
    with open("/etc/ld.so.cache", "rb") as host, open(f"{folder}/ld.so.cache", "rb") as copy:
        assert host.read() == copy.read()
    assert os.readlink(f"{folder}/localtime") == os.readlink("/etc/localtime")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755
    # Made once per set of mount points, in whatever order they come.
    assert prepared_etc(["/etc/no-such-file", "/etc/hosts"]) == folder
    assert prepared_etc() != folder

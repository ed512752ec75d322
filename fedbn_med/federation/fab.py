"""Bounds on the Flower App Bundle (FAB) a site downloads, checked before it is read.

Each site fetches the run's FAB to read its default run config from ``pyproject.toml``.
A FAB is a zip archive that the server's operator builds, so it may be a bomb: a 1 MB
archive holding a ``pyproject.toml`` that inflates to 1 GiB cost a site 58 s and 2.2 GB
of memory before issue 44. :func:`check_fab` reads only the archive's directory (the
sizes each member declares) and refuses an archive over :data:`MAX_FAB_BYTES`, a member
over :data:`MAX_MEMBER_BYTES` once inflated, or members over :data:`MAX_UNPACKED_BYTES`
together. Python's ``zipfile`` inflates a member only up to its declared size (and then
checks its CRC), so the declared sizes bound what reading it costs. The download itself
is bounded while it arrives (:mod:`fedbn_med.federation._bounded_http`).
"""

from __future__ import annotations

import io
import zipfile

__all__ = ["MAX_FAB_BYTES", "MAX_MEMBER_BYTES", "MAX_UNPACKED_BYTES", "check_fab"]

#: The most bytes of a FAB a site downloads (the shipped app's FAB is a few kB).
MAX_FAB_BYTES = 8 << 20
#: The most bytes one member of a FAB may inflate to (``pyproject.toml`` among them).
MAX_MEMBER_BYTES = 1 << 20
#: The most bytes all members of a FAB may inflate to together.
MAX_UNPACKED_BYTES = 32 << 20
#: The most members a FAB may list.
MAX_MEMBERS = 4096


def check_fab(content: bytes) -> None:
    """Refuse a FAB whose size, or whose members' inflated sizes, exceed the bounds.

    Raises
    ------
    ValueError
        Naming the bound crossed and the member (never its contents).
    """
    if len(content) > MAX_FAB_BYTES:
        raise ValueError(f"The run's FAB is {len(content)} bytes; a site downloads at most "
                         f"{MAX_FAB_BYTES}.")
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile as err:
        raise ValueError(f"The run's FAB is not a zip archive ({err}).") from None
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"The run's FAB lists {len(members)} files; a site reads at most "
                         f"{MAX_MEMBERS}.")
    total = 0
    for member in members:
        if member.file_size > MAX_MEMBER_BYTES:
            raise ValueError(f"The run's FAB holds {member.filename[:100]!r}, which inflates "
                             f"to {member.file_size} bytes; a site reads at most "
                             f"{MAX_MEMBER_BYTES} per file.")
        total += member.file_size
    if total > MAX_UNPACKED_BYTES:
        raise ValueError(f"The run's FAB inflates to {total} bytes; a site reads at most "
                         f"{MAX_UNPACKED_BYTES}.")

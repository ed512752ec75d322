"""Which tile belongs to which site: the TCGA tissue source sites of MoNuSeg, and two rules.

A MoNuSeg tile is named by its TCGA barcode, ``TCGA-<TSS>-<participant>-...``; the
tissue source site (TSS) is the hospital that sent the slide, and the TCGA study it sent
it to gives the organ. :data:`TSS` lists both for the 18 TSS codes of the MoNuSeg 2018
training tiles, as the GDC's tissue source site code table gives them (read from the
copy ``Tissue_source_site_code.csv`` of github.com/wfma/Ma_2018). The challenge's own
organ list calls TSS 18, 21, 38, 49 and 50 "liver"; their TCGA studies are lung (LUSC,
LUAD), which :data:`TSS` follows.

Two documented rules turn tiles into federation sites (``docs/results/histo.md``):

- ``"hospital"``: every institution (several TSS codes may be one hospital: UNC,
  University of Pittsburgh, Roswell Park) stays whole in one site; institutions, largest
  first (then by name), go to the site with the fewest tiles so far (then the lowest
  index), over :data:`HOSPITAL_SITES` sites;
- ``"organ"``: one site per organ with at least :data:`MIN_ORGAN_TILES` tiles; the
  smaller organs together form the site ``"other"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["HOSPITAL_SITES", "MIN_ORGAN_TILES", "RULES", "TSS", "Source", "assign_sites",
           "site_table", "tss_code"]

#: The site rules :func:`assign_sites` knows.
RULES = ("hospital", "organ")
#: Sites of the ``"hospital"`` rule.
HOSPITAL_SITES = 4
#: The fewest tiles an organ needs to be a site of its own under the ``"organ"`` rule.
MIN_ORGAN_TILES = 4


@dataclass(frozen=True)
class Source:
    """A tissue source site: the institution, its TCGA study and the study's organ."""

    institution: str
    study: str
    organ: str


#: The TSS codes of the MoNuSeg 2018 training tiles (GDC tissue source site codes).
TSS: dict[str, Source] = {
    "18": Source("Princess Margaret Hospital (Canada)", "Lung squamous cell carcinoma", "lung"),
    "21": Source("Fox Chase Cancer Center", "Lung squamous cell carcinoma", "lung"),
    "38": Source("UNC", "Lung adenocarcinoma", "lung"),
    "49": Source("Johns Hopkins", "Lung adenocarcinoma", "lung"),
    "50": Source("University of Pittsburgh", "Lung adenocarcinoma", "lung"),
    "A7": Source("Christiana Healthcare", "Breast invasive carcinoma", "breast"),
    "AR": Source("Mayo", "Breast invasive carcinoma", "breast"),
    "AY": Source("UNC", "Colon adenocarcinoma", "colon"),
    "B0": Source("University of Pittsburgh", "Kidney renal clear cell carcinoma", "kidney"),
    "CH": Source("Indivumed", "Prostate adenocarcinoma", "prostate"),
    "DK": Source("Memorial Sloan Kettering", "Bladder Urothelial Carcinoma", "bladder"),
    "E2": Source("Roswell Park", "Breast invasive carcinoma", "breast"),
    "G2": Source("MD Anderson", "Bladder Urothelial Carcinoma", "bladder"),
    "G9": Source("Roswell Park", "Prostate adenocarcinoma", "prostate"),
    "HE": Source("Ontario Institute for Cancer Research (OICR)",
                 "Kidney renal papillary cell carcinoma", "kidney"),
    "KB": Source("University Health Network, Toronto", "Stomach adenocarcinoma", "stomach"),
    "NH": Source("Candler", "Colon adenocarcinoma", "colon"),
    "RD": Source("Peter MacCallum Cancer Center", "Stomach adenocarcinoma", "stomach"),
}

_BARCODE = re.compile(r"^TCGA-([0-9A-Z]{2})-")


def tss_code(tile_id: str) -> str:
    """Return the TSS code of a tile's TCGA barcode (``TCGA-B0-5698-...`` -> ``B0``).

    Raises
    ------
    ValueError
        When the name is no TCGA barcode.
    """
    match = _BARCODE.match(tile_id)
    if match is None:
        raise ValueError(f"Tile '{tile_id}' is not named by a TCGA barcode "
                         f"(TCGA-<TSS>-<participant>-...); expected e.g. "
                         f"'TCGA-B0-5698-01Z-00-DX1'.")
    return match.group(1)


def _source(tile_id: str, table: Mapping[str, Source]) -> Source:
    code = tss_code(tile_id)
    if code not in table:
        raise ValueError(f"Tile '{tile_id}': TSS code '{code}' is not in the table of "
                         f"tissue source sites (known: {', '.join(sorted(table))}).")
    return table[code]


def assign_sites(tile_ids: Iterable[str], rule: str, *,
                 table: Mapping[str, Source] = TSS) -> dict[str, list[str]]:
    """Return each site's tiles (sorted) under ``rule`` (``"hospital"`` or ``"organ"``).

    Raises
    ------
    ValueError
        For an unknown rule, or a tile whose TSS code the table lacks.
    """
    if rule not in RULES:
        raise ValueError(f"Unknown site rule '{rule}'. Valid rules: {', '.join(RULES)}.")
    tiles = sorted(set(tile_ids))
    if rule == "organ":
        by_organ: dict[str, list[str]] = {}
        for tile in tiles:
            by_organ.setdefault(_source(tile, table).organ, []).append(tile)
        out: dict[str, list[str]] = {}
        for organ, members in sorted(by_organ.items()):
            name = organ if len(members) >= MIN_ORGAN_TILES else "other"
            out.setdefault(name, []).extend(members)
        return {name: sorted(members) for name, members in sorted(out.items())}
    by_place: dict[str, list[str]] = {}
    for tile in tiles:
        by_place.setdefault(_source(tile, table).institution, []).append(tile)
    order = sorted(by_place, key=lambda name: (-len(by_place[name]), name))
    groups: list[list[str]] = [[] for _ in range(HOSPITAL_SITES)]
    for place in order:
        target = min(range(HOSPITAL_SITES), key=lambda i: (len(groups[i]), i))
        groups[target].extend(by_place[place])
    return {f"H{i + 1}": sorted(g) for i, g in enumerate(groups) if g}


def site_table(sites: Mapping[str, Sequence[str]], table: Mapping[str, Source] = TSS
               ) -> str:
    """Return a markdown table of each site's tiles, institutions and organs."""
    lines = ["| site | tiles | institutions (TSS) | organs |", "|---|---|---|---|"]
    for name, tiles in sites.items():
        codes = sorted({tss_code(t) for t in tiles})
        places = sorted({f"{table[c].institution} ({c})" for c in codes})
        organs = sorted({table[c].organ for c in codes})
        lines.append(f"| {name} | {len(tiles)} | {'; '.join(places)} | {', '.join(organs)} |")
    return "\n".join(lines)

"""Which site is behind which node: asked once per node, waited for with a deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, MessageType

from fedbn_med.federation.records import pack, unpack

if TYPE_CHECKING:
    from fedbn_med.federation.config import ServerSettings
    from fedbn_med.federation.server.grid import FastGrid
    from fedbn_med.spec import RunSpec

__all__ = ["SiteDiscovery"]

logger = logging.getLogger("fedbn_med.server")


class SiteDiscovery:
    """The part of :class:`~fedbn_med.federation.server.FederationServer` that finds sites.

    It keeps ``sites`` (node ID to site name) current: a node seen for the first time is
    asked which site it is (a QUERY message); a site that restarts comes back as a new
    node and replaces its old one.
    """

    grid: FastGrid
    config: RunSpec
    settings: ServerSettings
    min_sites: int
    input_shape: tuple[int, ...]
    sites: dict[int, str]
    asked: set[int]
    query_attempts: dict[int, int]

    def _event(self, **event: object) -> None:
        raise NotImplementedError

    def discover(self) -> None:
        """Wait (bounded) for the expected sites; ask each node which site it is."""
        expected = set(self.config.sites)
        deadline = time.monotonic() + self.settings.wait_timeout
        while True:
            self._query_new_nodes()
            found = set(self.sites.values())
            if expected <= found:
                break
            if time.monotonic() > deadline:
                missing = sorted(expected - found)
                if len(found & expected) >= self.min_sites:
                    logger.warning("Starting without sites %s after %.0f s", missing,
                                   self.settings.wait_timeout)
                    break
                raise TimeoutError(
                    f"Only {len(found & expected)} of {len(expected)} sites connected within "
                    f"{self.settings.wait_timeout:.0f} s (at least {self.min_sites} "
                    f"needed). Missing sites: {', '.join(missing)}."
                )
            time.sleep(0.2)
        self._event(event="ready", sites=sorted(set(self.sites.values())))

    def _query_new_nodes(self) -> list[int]:
        """Ask nodes not seen before which site they are; return the connected nodes."""
        connected = self.grid.node_ids()
        new = [n for n in connected if n not in self.asked]
        if new:
            self.asked.update(new)
            answered = self._query(new)
            # A node that did not answer (still loading its data, or dead) is asked again
            # later, a few times at most.
            for node in set(new) - answered:
                self.query_attempts[node] = self.query_attempts.get(node, 0) + 1
                if self.query_attempts[node] < 3:
                    self.asked.discard(node)
        return connected

    def _query(self, node_ids: list[int]) -> set[int]:
        messages = [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY)
                    for n in node_ids]
        answered: set[int] = set()
        timeout = min(self.settings.wait_timeout, 30.0)
        for reply in self.grid.send(messages, timeout=timeout):
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                logger.error("Node %s failed to start its site: %s", node, reply.error.reason)
                self._event(event="site-error", node=node, reason=reply.error.reason)
                continue
            try:
                info = unpack(reply.content).section("info")
                site = str(info["site"])
            except (ValueError, KeyError) as err:
                logger.error("Node %s answered the query with a malformed message: %s", node,
                             err)
                continue
            shape = tuple(int(d) for d in info["input-shape"])  # type: ignore[union-attr]
            if site not in self.config.sites and not self.settings.allow_join:
                logger.error("Node %s is site '%s', which is not in this federation (%s); "
                             "ignored (allow-join is off).", node, site,
                             ", ".join(self.config.sites))
                continue
            if shape != tuple(self.input_shape):
                reason = (f"Site '{site}' has data of shape (N, {', '.join(map(str, shape))}) "
                          "but the federation's model takes "
                          f"(N, {', '.join(map(str, self.input_shape))}); the site is refused.")
                logger.error(reason)
                self._event(event="site-refused", site=site, reason=reason)
                continue
            rejoin = site in self.sites.values()
            if site not in self.config.sites and not rejoin:
                # A new site joins a running federation: it receives the current shared
                # weights with its first round and trains its own BN layers from there.
                logger.info("Site %s joins the federation", site)
            self.sites = {n: s for n, s in self.sites.items() if s != site}
            self.sites[node] = site
            logger.info("Site %s is node %s (resumed round %s)", site, node,
                        info["resumed-round"])
            self._event(event="rejoined" if rejoin else "joined", site=site, node=node,
                        resumed_round=int(info["resumed-round"]),
                        private_hash=str(info.get("private-hash", "")))
        return answered

    def _live_nodes(self, connected: Iterable[int] | None = None) -> dict[int, str]:
        connected = set(self.grid.node_ids() if connected is None else connected)
        return {n: s for n, s in self.sites.items() if n in connected}

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
    waiting: dict[int, str]  # refused because their site is served: node -> site
    silent: set[int]  # nodes that did not answer the last round they were sent

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
        self._admit_waiting(connected)
        new = [n for n in connected if n not in self.asked]
        keyed = self.settings.node_sites
        if keyed:
            # With the consortium's key list a node's key says which site it is: a node
            # whose key is not on the list is never asked, nor waited for.
            for node in [n for n in new if str(n) not in keyed]:
                logger.error("Node %s has no site in the consortium's key list; ignored.",
                             node)
                self.asked.add(node)
            new = [n for n in new if str(n) in keyed]
            if not self.settings.allow_join:
                # nor is a node whose key is of a site outside this run
                for node in [n for n in new if keyed[str(n)] not in self.config.sites]:
                    logger.error("Node %s holds the key of site '%s', which is not in this "
                                 "run; ignored.", node, keyed[str(node)])
                    self.asked.add(node)
                new = [n for n in new if keyed[str(n)] in self.config.sites]
        if new and not self.settings.allow_join and not self._unserved(connected):
            # Every site of the run has a node that answers: a new node is a stray or a
            # site's second process. It is asked once a site goes missing (a restarted
            # site), and never holds up a round before that.
            logger.debug("Nodes %s not asked: every site of the run is served", new)
            return connected
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

    def _holder(self, site: str, connected: Iterable[int]) -> int | None:
        """Return the node that serves ``site`` now: connected and not silent."""
        silent = self.silent
        live = set(connected)
        return next((n for n, s in self.sites.items()
                     if s == site and n in live and n not in silent), None)

    def _unserved(self, connected: Iterable[int]) -> set[str]:
        """Return the run's sites that no connected, answering node serves."""
        return {s for s in self.config.sites if self._holder(s, connected) is None}

    def _admit_waiting(self, connected: list[int]) -> None:
        # A node refused because its site was served already takes over once the node
        # that served it has gone or fell silent (a restarted site whose old process was
        # killed), never while that node still answers.
        waiting = self.waiting
        for node, site in list(waiting.items()):
            if node not in connected:
                del waiting[node]
            elif self._holder(site, connected) is None:
                del waiting[node]
                self.sites = {n: s for n, s in self.sites.items() if s != site}
                self.sites[node] = site
                logger.info("Site %s is node %s now (its previous node went silent)", site,
                            node)
                self._event(event="rejoined", site=site, node=node,
                            resumed_round=-1, private_hash="")

    def _query(self, node_ids: list[int]) -> set[int]:
        messages = [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY)
                    for n in node_ids]
        answered: set[int] = set()
        expected = set(self.config.sites)
        missing = expected - set(self._live_nodes().values())
        # When every site of the run is served, a new node is most likely a stray: it
        # gets a short wait; while a site is missing, the wait ends once it answers.
        timeout = min(self.settings.wait_timeout, 30.0 if missing else 5.0)

        def enough(replies: list[Message]) -> bool:
            return bool(missing) and missing <= {_claim(r) for r in replies}

        for reply in self.grid.send(messages, timeout=timeout, until=enough):
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                logger.error("Node %s failed to start its site: %s", node, reply.error.reason)
                self._event(event="site-error", node=node, reason=reply.error.reason)
                continue
            try:
                info = unpack(reply.content).section("info")
                site = str(info["site"])
                shape = tuple(int(d) for d in info["input-shape"])  # type: ignore[union-attr]
                resumed = int(info["resumed-round"])  # type: ignore[arg-type]
            except (ValueError, KeyError, TypeError) as err:
                logger.error("Node %s answered the query with a malformed message: %s", node,
                             err)
                continue
            keyed = self.settings.node_sites.get(str(node))
            if keyed is not None and keyed != site:
                reason = (f"Node {node} holds the key of site '{keyed}' but says it is "
                          f"'{site}'; refused.")
                logger.error(reason)
                self.asked.discard(node)  # the real site may come with this key later
                self._event(event="site-refused", site=site, node=node, reason=reason)
                continue
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
            holder = self._holder(site, self.grid.node_ids())
            if holder is not None and holder != node:
                reason = (f"Node {node} says it is site '{site}', which node {holder} serves "
                          "and still answers; refused (it takes over only if that node goes "
                          "away or falls silent).")
                logger.error(reason)
                self._event(event="site-refused", site=site, node=node, reason=reason)
                self.waiting[node] = site
                continue
            rejoin = site in self.sites.values()
            if site not in self.config.sites and not rejoin:
                # A new site joins a running federation: it receives the current shared
                # weights with its first round and trains its own BN layers from there.
                logger.info("Site %s joins the federation", site)
            self.sites = {n: s for n, s in self.sites.items() if s != site}
            self.sites[node] = site
            logger.info("Site %s is node %s (resumed round %s)", site, node, resumed)
            self._event(event="rejoined" if rejoin else "joined", site=site, node=node,
                        resumed_round=resumed,
                        private_hash=str(info.get("private-hash", "")))
        return answered

    def _live_nodes(self, connected: Iterable[int] | None = None) -> dict[int, str]:
        """Return node ID to site for the site nodes connected now."""
        connected = set(self.grid.node_ids() if connected is None else connected)
        return {n: s for n, s in self.sites.items() if n in connected}


def _claim(reply: Message) -> str | None:
    """Return the site a query reply names (None for an error or a malformed reply)."""
    if reply.has_error():
        return None
    try:
        return str(unpack(reply.content).section("info")["site"])
    except (ValueError, KeyError):
        return None

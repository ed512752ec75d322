"""Which site is behind which node: asked once per node, waited for with a deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, MessageType

from fedbn_med.federation.events import Event, Joined, Ready, Rejoined, SiteError, SiteRefused
from fedbn_med.federation.records import pack
from fedbn_med.federation.server.checks import claimed_site, error_reason, read_query, refusal

if TYPE_CHECKING:
    from fedbn_med.federation.config import ServerSettings
    from fedbn_med.federation.server.grid import FastGrid

__all__ = ["SiteRegistry"]

logger = logging.getLogger("fedbn_med.server")

#: A node that does not answer its query (still loading its data, or dead) is asked again
#: later, this many times in all.
QUERY_ATTEMPTS = 3


class SiteRegistry:
    """Which site each node serves, kept current as nodes come, go and fall silent.

    A node seen for the first time is asked which site it is (a QUERY message); what it
    says is checked (:func:`~fedbn_med.federation.server.checks.read_query`), against the
    consortium's key list when there is one. A site that restarts comes back as a new node
    and replaces its old one; a node that claims a site another node still serves waits,
    and takes over only once that node has gone or fallen silent.

    Parameters
    ----------
    grid : FastGrid
        Where the nodes are.
    run_sites : collection of str
        The sites of the run.
    settings : ServerSettings
        The wait timeout, the key list (``node_sites``) and ``allow_join``.
    input_shape : tuple of int
        The shape of one example the federation's model takes.
    min_sites : int
        The fewest sites a round may start with.
    record : callable
        Where the registry's events go (the run's recorder).
    """

    def __init__(self, grid: FastGrid, run_sites: Collection[str], settings: ServerSettings,
                 input_shape: tuple[int, ...], min_sites: int,
                 record: Callable[[Event], None]) -> None:
        self.grid = grid
        self.run_sites = tuple(run_sites)
        self.settings = settings
        self.input_shape = tuple(input_shape)
        self.min_sites = min_sites
        self.record = record
        self.sites: dict[int, str] = {}  # node -> the site it serves
        self.asked: set[int] = set()
        self.query_attempts: dict[int, int] = {}
        self.waiting: dict[int, str] = {}  # refused because their site is served: node -> site
        self.silent: set[int] = set()  # nodes that did not answer the last round they were sent
        self.counts: dict[str, int] = {}  # site -> the training examples it says it has

    # -- what the rounds ask -------------------------------------------------------------
    def names(self) -> list[str]:
        """Return the sites that some node serves, sorted."""
        return sorted(set(self.sites.values()))

    def live(self, connected: Iterable[int] | None = None) -> dict[int, str]:
        """Return node ID to site for the site nodes connected now."""
        connected = set(self.grid.node_ids() if connected is None else connected)
        return {n: s for n, s in self.sites.items() if n in connected}

    def refresh(self) -> dict[int, str]:
        """Ask new nodes which site they are (a restarted site rejoins here); return live ones."""
        return self.live(self._query_new_nodes())

    def heard(self, sent: Iterable[int], answered: Collection[int]) -> None:
        """Note which of the nodes sent a round answered it: the others are silent."""
        self.silent = (self.silent | set(sent)) - set(answered)

    def discover(self) -> None:
        """Wait (bounded) for the expected sites; ask each node which site it is."""
        expected = set(self.run_sites)
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
        self.record(Ready(sites=self.names()))

    # -- finding nodes -------------------------------------------------------------------
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
                for node in [n for n in new if keyed[str(n)] not in self.run_sites]:
                    logger.error("Node %s holds the key of site '%s', which is not in this "
                                 "run; ignored.", node, keyed[str(node)])
                    self.asked.add(node)
                new = [n for n in new if keyed[str(n)] in self.run_sites]
        if new and not self.settings.allow_join and not self._unserved(connected):
            # Every site of the run has a node that answers: a new node is a stray or a
            # site's second process. It is asked once a site goes missing (a restarted
            # site), and never holds up a round before that.
            logger.debug("Nodes %s not asked: every site of the run is served", new)
            return connected
        if new:
            self.asked.update(new)
            answered = self._query(new)
            for node in set(new) - answered:
                self.query_attempts[node] = self.query_attempts.get(node, 0) + 1
                if self.query_attempts[node] < QUERY_ATTEMPTS:
                    self.asked.discard(node)
        return connected

    def _holder(self, site: str, connected: Iterable[int]) -> int | None:
        """Return the node that serves ``site`` now: connected and not silent."""
        live = set(connected)
        return next((n for n, s in self.sites.items()
                     if s == site and n in live and n not in self.silent), None)

    def _unserved(self, connected: Iterable[int]) -> set[str]:
        """Return the run's sites that no connected, answering node serves."""
        connected = list(connected)
        return {s for s in self.run_sites if self._holder(s, connected) is None}

    def _assign(self, node: int, site: str) -> None:
        self.sites = {n: s for n, s in self.sites.items() if s != site}
        self.sites[node] = site

    def _admit_waiting(self, connected: list[int]) -> None:
        # A node refused because its site was served already takes over once the node
        # that served it has gone or fell silent (a restarted site whose old process was
        # killed), never while that node still answers.
        for node, site in list(self.waiting.items()):
            if node not in connected:
                del self.waiting[node]
            elif self._holder(site, connected) is None:
                del self.waiting[node]
                self._assign(node, site)
                logger.info("Site %s is node %s now (its previous node went silent)", site,
                            node)
                self.record(Rejoined(site=site, node=node, resumed_round=-1, private_hash=""))

    # -- asking nodes --------------------------------------------------------------------
    def _query(self, node_ids: list[int]) -> set[int]:
        messages = [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY)
                    for n in node_ids]
        answered: set[int] = set()
        missing = set(self.run_sites) - set(self.live().values())
        # When every site of the run is served, a new node is most likely a stray: it
        # gets a short wait; while a site is missing, the wait ends once it answers.
        timeout = min(self.settings.wait_timeout, 30.0 if missing else 5.0)

        def enough(replies: list[Message]) -> bool:
            return bool(missing) and missing <= {claimed_site(r) for r in replies}

        for reply in self.grid.send(messages, timeout=timeout, until=enough):
            node = reply.metadata.src_node_id
            if node not in node_ids or node in answered:
                continue  # a reply from no node asked, or a second one: nothing to learn
            answered.add(node)
            if reply.has_error():
                reason = error_reason(reply)
                logger.error("Node %s failed to start its site: %s", node, reason)
                self.record(SiteError(node=node, reason=reason))
                continue
            try:
                info = read_query(reply.content)
            except Exception as err:  # whatever is wrong with one reply refuses it alone
                logger.error("Node %s answered the query with a malformed message: %s", node,
                             refusal(err))
                continue
            refused = self._refusal(node, info.site, info.input_shape)
            if refused is not None:
                logger.error(refused)
                self.record(SiteRefused(site=info.site, node=node, reason=refused))
                continue
            if info.site not in self.run_sites and not self.settings.allow_join:
                logger.error("Node %s is site '%s', which is not in this federation (%s); "
                             "ignored (allow-join is off).", node, info.site,
                             ", ".join(self.run_sites))
                continue
            rejoin = info.site in self.sites.values()
            if info.site not in self.run_sites and not rejoin:
                # A new site joins a running federation: it receives the current shared
                # weights with its first round and trains its own BN layers from there.
                logger.info("Site %s joins the federation", info.site)
            self._assign(node, info.site)
            self.counts[info.site] = info.num_train
            logger.info("Site %s is node %s (resumed round %s)", info.site, node,
                        info.resumed_round)
            joined = Rejoined if rejoin else Joined
            self.record(joined(site=info.site, node=node, resumed_round=info.resumed_round,
                               private_hash=info.private_hash))
        return answered

    def _refusal(self, node: int, site: str, shape: tuple[int, ...]) -> str | None:
        """Return why a node's claim to be ``site`` is refused, or None."""
        keyed = self.settings.node_sites.get(str(node))
        if keyed is not None and keyed != site:
            self.asked.discard(node)  # the real site may come with this key later
            return f"Node {node} holds the key of site '{keyed}' but says it is '{site}'; refused."
        if site not in self.run_sites and not self.settings.allow_join:
            return None  # ignored, not refused (see _query)
        if shape != self.input_shape:
            return (f"Site '{site}' has data of shape (N, {', '.join(map(str, shape))}) but "
                    f"the federation's model takes (N, {', '.join(map(str, self.input_shape))}); "
                    "the site is refused.")
        holder = self._holder(site, self.grid.node_ids())
        if holder is not None and holder != node:
            self.waiting[node] = site
            return (f"Node {node} says it is site '{site}', which node {holder} serves and "
                    "still answers; refused (it takes over only if that node goes away or "
                    "falls silent).")
        return None

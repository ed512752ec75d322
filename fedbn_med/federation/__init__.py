"""The Flower adapter: the only package of fedbn_med that imports flwr.

- :mod:`.client_app`: the ClientApp that wraps a site's :class:`~fedbn_med.trainer.SiteTrainer`.
- :mod:`.server_app`: the ServerApp that runs the rounds, aggregates and tracks.
- :mod:`.node`: a long-lived site node speaking Flower's Fleet API (one process per site).
- :mod:`.launcher`: starts and stops a SuperLink, site nodes and runs on 127.0.0.1.

Pinned to flwr 1.42.0: the site node and the server's fast polling use flwr internals.
"""

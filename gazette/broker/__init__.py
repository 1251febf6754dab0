"""The journal broker: replicas, append and read paths, fragments and their stores.

The broker's side of fragments is flat here, so that ``fragment`` names one package
(:mod:`gazette.fragment`: the fragment type, codecs, and the fragment stores under
:mod:`gazette.fragment.stores`, which the client, gazctl and Spark read too):

* :mod:`.spool` — :class:`~gazette.broker.spool.Spool`, the replica's state machine over
  ReplicateRequests.
* :mod:`.index` — :class:`~gazette.broker.index.Index`, which fragment serves a read at an offset.
* :mod:`.persister` — :class:`~gazette.broker.persister.Persister`, which uploads completed spools.
* :mod:`.store_health` — :class:`~gazette.broker.store_health.StoreHealth`, each store's cached
  health check.
"""

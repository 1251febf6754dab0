"""bike-share: finding cycles in bike-share rides, exactly once (Gazette's
``examples/bike-share``).

* ``rides``: a generator of rides in the Citi Bike 2019 trip-data CSV schema, with planted
  cycles (and decoys that must not be found) so results are checkable.
* ``app``: the consumer application. Each ``cycles-part-NNN`` shard loads its partition's
  rides into a ``rides`` table (PostgreSQL through ``SQLStore`` or embedded SQLite through
  ``SQLiteStore``, by the shard's ``store`` label), windows each bike to its most recent
  rides, finds a just-completed cycle with a recursive CTE, and publishes ``Cycle`` messages;
  ``GET /api/bikes?id=N`` serves a bike's recent rides from whichever process asked.
* ``stream_rides.sh``: the seed's pipeline, ``gazctl attach-uuids | awk | rate limit | gazctl
  journals append --mapping modulo``.
"""

import time, pathlib, tempfile, httpx, threading, numpy as np, sys
sys.path.insert(0, 'tests')
from qdrant.fixtures import *
from test_qdrant_server import _points
from indexer.store import ServerStore, ServerOptions
d = pathlib.Path(tempfile.mkdtemp())
with running(make_cluster(d/'c')) as c:
    s = ServerStore(c.url, options=ServerOptions(**CLUSTER_COLLECTIONS))
    s.ensure_collection('c', {'text':384})
    s.upsert('c', _points(40, 'h1', 100))
    c.nodes[1].kill()
    t=time.time()
    try: s.client.upsert('c', [s._struct(p) for p in _points(40, 'h2', 100)])
    except Exception as e: print('KILLED:', time.time()-t, str(e)[:1000])
    threading.Timer(1.0, c.nodes[1].start).start()
    t=time.time()
    for i in range(40):
        try:
            s.client.upsert('c', [s._struct(p) for p in _points(40, 'h3', 100)]); print('ok after', time.time()-t); break
        except Exception as e: print(time.time()-t, str(e)[:1500])
        for n in c.nodes:
            try: print('  ', [(x['shard_id'], x['state']) for x in httpx.get(f"{n.url}/collections/c/cluster").json()['result']['local_shards']])
            except Exception as e: print('  ', e)
        time.sleep(0.5)

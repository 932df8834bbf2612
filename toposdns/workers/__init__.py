"""`toposdns serve --workers N`: one supervisor and N worker processes that share the DNS port.

The supervisor (supervisor.py) runs the source once (the Kubernetes watches or the snapshot
file), serves `--http`, and forks the workers (worker.py) once the data is loaded, so they start
with it in copy-on-write memory. After that it streams every change to every worker as a message
(messages.py); each worker applies it to its own copy and answers DNS on the port it binds with
SO_REUSEPORT, the kernel spreading queries among them. `cpus.py` finds how many CPUs the process
may use, the default number of workers; `exposition.py` sums the workers' metrics.
"""

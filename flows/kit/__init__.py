"""The flows layer's machinery, under the stage files of ``flows/``: the stage kit
(``stage``: a declared stage made a Prefect flow, the invocation around it), fan-out
over the spec's runner (``runners``), progress bars,
what a run records (``run_record``), the processes a run starts and stops
(``processes``: the temporary Prefect server, pool workers, logs), training on ranks
(``training``) and the Prefect deployments' pull steps (``deployment_steps``).

Nothing is imported here: ``xylent stages`` loads the command line (xylent/cli.py) without Prefect.
"""

"""`batchscope bench --workload served`: requests arriving over time with mixed lengths.
    workload.py        the plan (arrival offsets, prompts, output lengths from a seed), sending and timing it
    client_figures.py  one run's figures, and their medians over repeats
    procedure.py       the order of work and the result
"""

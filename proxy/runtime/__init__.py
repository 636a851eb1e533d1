"""How the process runs, set up once by `promaccel serve` / the app:

    memory.py    glibc's mmap threshold and Arrow's pool (tune_malloc), and freed memory given
                 back after large answers (give_back_soon)
"""

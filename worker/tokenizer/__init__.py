"""Loading tiktoken's encodings offline (``offline``) and the cache of their parsed ranks
(``rank_cache``): files and environment, kept out of the pure core, which only counts
with an encoding it is handed."""


$
"

gpt2-small

layers
seq€P€€€€`’Ð

$
"

gpt2-small

layers
seq€0@

$
"

gpt2-small
seq€

layershp’	š™™™™™É?
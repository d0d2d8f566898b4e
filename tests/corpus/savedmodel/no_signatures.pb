A
"serve*2.99.0.
,
xPlaceholder*
dtype0*
shape:
ß
"serve*2.99.0y
.
xPlaceholder*
dtype0*
shape:
,
pPlaceholder*
dtype0*
shape:

yAddV2xp*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict
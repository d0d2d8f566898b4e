Ì
"serve*2.99.0f
.
xPlaceholder*
dtype0*
shape:

yAddV2zx*
T0

zAddV2yx*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict